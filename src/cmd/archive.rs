//! A `.tar.gz` written by hand: POSIX ustar headers for regular files under one
//! directory, gzip by `flate2`. What the support bundle needs and no more (no links,
//! no long names: every name here is ours and short), in a few dozen lines instead of
//! the `tar` crate. It touches nothing but the writer it is given.

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;

/// Writes `files` (name, contents) as `dir/name` entries of a gzip-compressed tar.
pub fn write_tar_gz(
    out: impl Write,
    dir: &str,
    files: &[(String, Vec<u8>)],
    mtime: u64,
) -> std::io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    for (name, contents) in files {
        let path = format!("{dir}/{name}");
        gz.write_all(&header(&path, contents.len() as u64, mtime)?)?;
        gz.write_all(contents)?;
        let pad = (512 - contents.len() % 512) % 512;
        gz.write_all(&vec![0u8; pad])?;
    }
    // The end of the archive: two zero blocks.
    gz.write_all(&[0u8; 1024])?;
    gz.finish()?.flush()
}

/// The 512-byte ustar header of a regular file, mode 0644.
fn header(path: &str, size: u64, mtime: u64) -> std::io::Result<[u8; 512]> {
    if path.len() > 100 || !path.is_ascii() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("archive name too long or not ASCII: {path}"),
        ));
    }
    let mut h = [0u8; 512];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, path.as_bytes());
    put(100, b"0000644\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(136, format!("{mtime:011o}\0").as_bytes());
    put(148, b"        ");
    put(156, b"0");
    put(257, b"ustar\0");
    put(263, b"00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's `tar` reads what we write, byte for byte.
    #[test]
    fn tar_reads_the_archive_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.tar.gz");
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let files = vec![
            ("status.json".to_string(), b"{\"pending\": 1}\n".to_vec()),
            ("config/effective.toml".to_string(), big.clone()),
            ("empty.txt".to_string(), Vec::new()),
        ];
        write_tar_gz(
            std::fs::File::create(&file).unwrap(),
            "bundle",
            &files,
            1_763_719_200,
        )
        .unwrap();
        let out = std::process::Command::new("tar")
            .arg("-xzf")
            .arg(&file)
            .arg("-C")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        for (name, contents) in &files {
            let read = std::fs::read(dir.path().join("bundle").join(name)).unwrap();
            assert_eq!(&read, contents, "{name}");
        }
        assert!(header(&"x".repeat(101), 0, 0).is_err());
    }
}
