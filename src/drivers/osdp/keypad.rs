//! PIN entry on an OSDP reader (osdp.md, PIN entry): the reader sends key
//! presses one or a few at a time; the hub keeps one entry per reader.
//! Pure: the bus task passes its monotonic milliseconds.

/// The most digits an entry holds; a longer one is `bad_format` on submit.
pub const MAX_DIGITS: usize = 12;
/// The fewest digits of a PIN; a shorter submitted entry is `bad_format`.
pub const MIN_DIGITS: usize = 4;
/// An entry with no key press for this long is discarded.
pub const IDLE_MS: u64 = 10_000;

/// What a submitted entry is.
#[derive(Clone, PartialEq, Eq)]
pub enum Submitted {
    /// 4..=12 digits: decide it like a serial Keypad.
    Pin(Vec<u8>),
    /// Too short or too long: denied `bad_format`, counted toward lockout.
    BadFormat,
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if let Submitted::Pin(p) = self {
            zeroize::Zeroize::zeroize(p);
        }
    }
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Submitted::Pin(p) => write!(f, "Pin({} digits)", p.len()),
            Submitted::BadFormat => f.write_str("BadFormat"),
        }
    }
}

/// One reader's entry buffer. Never logged: it is (part of) a PIN.
#[derive(Default)]
pub struct Entry {
    digits: Vec<u8>,
    /// More than [`MAX_DIGITS`] were typed (the extra ones are not kept).
    overflow: bool,
    last_key_ms: Option<u64>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Entry(redacted)")
    }
}

impl Entry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Throws the entry away (wiped): idle, cleared, submitted, or its
    /// reader's session ended (osdp.md, Supervision).
    pub fn clear(&mut self) {
        self.digits.iter_mut().for_each(|d| *d = 0);
        self.digits.clear();
        self.overflow = false;
        self.last_key_ms = None;
    }

    /// Discards an entry idle for [`IDLE_MS`]; call on every turn.
    pub fn tick(&mut self, now: u64) {
        if self
            .last_key_ms
            .is_some_and(|t| now.saturating_sub(t) >= IDLE_MS)
        {
            self.clear();
        }
    }

    /// Feeds raw osdp_KEYPAD codes; returns each entry submitted by them.
    pub fn keys(&mut self, keys: &[u8], now: u64) -> Vec<Submitted> {
        self.tick(now);
        let mut out = Vec::new();
        for &k in keys {
            self.last_key_ms = Some(now);
            match k {
                b'0'..=b'9' => {
                    if self.digits.len() < MAX_DIGITS {
                        self.digits.push(k);
                    } else {
                        self.overflow = true;
                    }
                }
                // '*' clears: 0x7F, or ASCII '*'.
                0x7F | b'*' => self.clear(),
                // '#' submits: 0x0D, or ASCII '#'.
                0x0D | b'#' => {
                    let s = if self.overflow || self.digits.len() < MIN_DIGITS {
                        Submitted::BadFormat
                    } else {
                        Submitted::Pin(self.digits.clone())
                    };
                    self.clear();
                    out.push(s);
                }
                // Function keys (0x41..=0x48) and anything else: ignored.
                _ => {}
            }
        }
        out
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(s: &str) -> Submitted {
        Submitted::Pin(s.as_bytes().to_vec())
    }

    #[test]
    fn digits_then_the_submit_key_make_a_pin() {
        let mut e = Entry::new();
        assert!(e.keys(b"4829", 0).is_empty());
        assert_eq!(e.keys(&[b'1', b'3', 0x0D], 100), vec![pin("482913")]);
        // The buffer is empty again.
        assert_eq!(e.keys(&[0x0D], 200), vec![Submitted::BadFormat]);
    }

    #[test]
    fn ascii_star_and_hash_work_like_the_osdp_codes() {
        let mut e = Entry::new();
        assert_eq!(e.keys(b"99*1234#", 0), vec![pin("1234")]);
        assert_eq!(
            e.keys(&[b'9', 0x7F, b'5', b'6', b'7', b'8', b'#'], 0),
            vec![pin("5678")]
        );
    }

    #[test]
    fn function_keys_are_ignored() {
        let mut e = Entry::new();
        assert_eq!(
            e.keys(&[b'1', 0x41, b'2', 0x48, b'3', b'4', 0x0D], 0),
            vec![pin("1234")]
        );
    }

    #[test]
    fn too_short_or_too_long_is_bad_format() {
        let mut e = Entry::new();
        assert_eq!(e.keys(b"123#", 0), vec![Submitted::BadFormat]);
        assert_eq!(e.keys(b"123456789012#", 0), vec![pin("123456789012")]);
        assert_eq!(e.keys(b"1234567890123#", 0), vec![Submitted::BadFormat]);
    }

    #[test]
    fn an_entry_idle_for_10_s_is_discarded() {
        let mut e = Entry::new();
        e.keys(b"12", 0);
        assert_eq!(e.keys(b"34#", 9_999), vec![pin("1234")]);
        e.keys(b"12", 20_000);
        e.tick(30_000);
        assert_eq!(e.keys(b"3456#", 30_001), vec![pin("3456")]);
    }

    #[test]
    fn debug_never_shows_digits() {
        let mut e = Entry::new();
        e.keys(b"987654", 0);
        assert!(!format!("{e:?}").contains('9'));
        assert!(!format!("{:?}", pin("987654")).contains('9'));
    }
}
