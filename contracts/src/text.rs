//! Bytes to text for every reader of user files (contract blocks,
//! `PORT_STATUS.md`, port specs): input that is not UTF-8 is refused with
//! the line and column of its first bad byte, not a bare "invalid data".

/// Where the bytes stop being UTF-8. `line` and `column` are 1-based; the
/// column counts the characters before the bad byte on its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not utf-8 text (byte 0x{byte:02x})")]
pub struct NotUtf8 {
    pub line: usize,
    pub column: usize,
    pub byte: u8,
}

/// `bytes` as text, or where they stop being UTF-8.
pub fn utf8(bytes: &[u8]) -> Result<&str, NotUtf8> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        let before = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        NotUtf8 {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
            byte: bytes[at],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bad_byte_is_placed_by_line_and_column() {
        assert_eq!(utf8(b"a\nb"), Ok("a\nb"));
        let e = utf8(b"key: 1\nna\xc3\xa9me: \xff\n").unwrap_err();
        assert_eq!((e.line, e.column, e.byte), (2, 8, 0xff));
        assert_eq!(e.to_string(), "not utf-8 text (byte 0xff)");
        let e = utf8(b"\x80").unwrap_err();
        assert_eq!((e.line, e.column), (1, 1));
        // A sequence cut short at the end.
        let e = utf8(b"ok\n\xe2\x82").unwrap_err();
        assert_eq!((e.line, e.column, e.byte), (2, 1, 0xe2));
    }
}
