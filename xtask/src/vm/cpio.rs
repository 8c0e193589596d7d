//! A minimal writer for the cpio "newc" format the kernel unpacks as an initramfs.
//!
//! Written here instead of shelling out to `cpio` so that the archive needs no staging
//! directory, no `mknod` for `/dev/console`, and is byte-for-byte reproducible (all
//! timestamps 0, owner root).

use std::io::{self, Write};

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

/// Streams newc entries into `out`; call [`Archive::finish`] to write the trailer.
#[derive(Debug)]
pub struct Archive<W: Write> {
    out: W,
    written: usize,
    next_ino: u32,
}

impl<W: Write> Archive<W> {
    /// Starts an archive.
    pub fn new(out: W) -> Self {
        Archive {
            out,
            written: 0,
            next_ino: 1,
        }
    }

    /// Adds a directory (parents must be added first).
    pub fn dir(&mut self, path: &str) -> io::Result<()> {
        self.entry(path, S_IFDIR | 0o755, 2, (0, 0), &[])
    }

    /// Adds a regular file with the given permission bits.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | (mode & 0o7777), 1, (0, 0), data)
    }

    /// Adds a character device node.
    pub fn char_device(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, S_IFCHR | (mode & 0o7777), 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.next_ino = 0;
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[])?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large for cpio"))?;
        let name_size = u32::try_from(name.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name too long for cpio"))?;
        let ino = self.next_ino;
        self.next_ino += 1;
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for field in fields {
            header.push_str(&format!("{field:08X}"));
        }
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len();
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = self.written % 4;
        if rem != 0 {
            self.write(&[0u8; 3][..4 - rem])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_trailer_present() {
        let mut archive = Archive::new(Vec::new());
        archive.dir("bin").unwrap();
        archive.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        archive.char_device("dev/console", 0o600, 5, 1).unwrap();
        let bytes = archive.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("#!/bin/sh"));
    }
}
