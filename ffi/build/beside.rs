//! For the build scripts of the C libraries (ffi/, nccl/): the SONAME, and the two files a C
//! user of this checkout needs beside the library in target/<profile>: the link named by the
//! SONAME (the name a program linked against the library asks for when it starts) and a
//! pkg-config file. Build scripts write only to OUT_DIR as a rule; these two small files are
//! the exception, because they must lie where cargo puts the library.

use std::path::{Path, PathBuf};

/// One C library.
pub struct Library<'a> {
    /// Its name: `lib{name}.so`, `-l{name}`, `{name}.pc`.
    pub name: &'a str,
    /// Its SONAME, `lib{name}.so.{major}`.
    pub soname: &'a str,
    /// The pkg-config description.
    pub description: &'a str,
    /// The pkg-config version.
    pub version: &'a str,
}

/// Gives the library its SONAME and writes the link and `{name}.pc` beside it. The `.pc` file
/// names the checkout's `include/` and the library's folder by absolute paths.
pub fn place(lib: &Library) {
    // Not rustc-cdylib-link-arg: cargo hands those on to the cdylibs of dependent packages too
    // (rust-lang/cargo#9562), and nccl/ depends on ffi/. This one reaches only this package's
    // links; its test executables get the name as well, which nothing reads.
    println!("cargo:rustc-link-arg=-Wl,-soname,{}", lib.soname);
    let Some(dir) = profile_dir() else {
        println!(
            "cargo:warning=no target/<profile> above OUT_DIR: {}.pc not written",
            lib.name
        );
        return;
    };
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let include = manifest.join("../include");
    let include = include.canonicalize().unwrap_or(include);
    let pc = format!(
        "# Written by the build script of {package} for this build; use it with\n\
         # PKG_CONFIG_PATH={dir} pkg-config --cflags --libs {name}\n\
         includedir={include}\n\
         libdir={dir}\n\
         \n\
         Name: {name}\n\
         Description: {description}\n\
         Version: {version}\n\
         Cflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -l{name}\n",
        package = std::env::var("CARGO_PKG_NAME").unwrap_or_default(),
        dir = dir.display(),
        include = include.display(),
        name = lib.name,
        description = lib.description,
        version = lib.version,
    );
    // Each file is written aside and renamed into place: builds of one profile may run side by
    // side (a test run building the libraries while another build runs).
    let tmp = dir.join(format!(".{}.pc.{}", lib.name, std::process::id()));
    let written = std::fs::write(&tmp, pc)
        .and_then(|()| std::fs::rename(&tmp, dir.join(format!("{}.pc", lib.name))));
    let link = dir.join(format!(".{}.{}", lib.soname, std::process::id()));
    let _ = std::fs::remove_file(&link);
    let linked = std::os::unix::fs::symlink(format!("lib{}.so", lib.name), &link)
        .and_then(|()| std::fs::rename(&link, dir.join(lib.soname)));
    for (what, result) in [("pkg-config file", written), ("SONAME link", linked)] {
        if let Err(e) = result {
            println!("cargo:warning={} of {}: {e}", what, lib.name);
        }
    }
}

/// target/<profile> (or target/<triple>/<profile>): OUT_DIR is `<it>/build/<package>-<hash>/out`.
fn profile_dir() -> Option<PathBuf> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let build = out.parent()?.parent()?;
    if build.file_name()? != "build" {
        return None;
    }
    build.parent().map(Path::to_path_buf)
}
