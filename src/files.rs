//! Reading the small text files a configuration names (`OXCCL_TOPO_FILE`, `OXCCL_TUNE_FILE`):
//! only regular files, read up to a bound, and never waiting — a FIFO or a device named by
//! mistake is refused at once instead of blocking creation without a deadline, and
//! `/dev/zero` instead of filling memory.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The text of the regular file at `path`, at most `cap` bytes.
pub(crate) fn read_text(path: &Path, cap: usize) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    // Opening a FIFO for reading waits for a writer, unless non-blocking.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut text = String::new();
    f.take(cap as u64 + 1).read_to_string(&mut text)?;
    if text.len() > cap {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("longer than {cap} bytes"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = std::env::temp_dir().join(format!("oxccl-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.txt");
        std::fs::write(&file, "hello").unwrap();
        assert_eq!(read_text(&file, 5).unwrap(), "hello");
        let e = read_text(&file, 4).unwrap_err();
        assert!(e.to_string().contains("longer than 4 bytes"), "{e}");
        // A FIFO with no writer: refused at once (a blocking open would wait for good).
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = read_text(&fifo, 100).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = read_text(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(read_text(&dir, 100).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
