//! Gives liboxccl.so its SONAME, so that programs linked against it record `liboxccl.so.0`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liboxccl.so.0");
}
