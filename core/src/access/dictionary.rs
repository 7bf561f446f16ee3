//! A dictionary from a policy's strings — capability and issuer ids, an
//! attribute's name and value together — to their numbers, built once with
//! the ruleset and looked up on every request.
//!
//! The strings a request brings are short (a claim value, an attribute name,
//! a capability id), and a general-purpose map spends most of a look-up
//! hashing them byte by byte and calling `memcmp`. Here a string's *key* is
//! its length and two 8-byte words loaded from its head and tail, which for
//! 16 bytes or fewer *is* the string (the words cover every byte); the keys
//! of an entry's strings are hashed by a multiplication each into an
//! open-addressed table at most half full. The table holds the keys
//! themselves beside the entry's number, so a look-up reads one place of it
//! and compares integers, rather than following a number to a separate array
//! of keys. Only strings longer than 16 bytes whose keys are equal are
//! compared further: by the one word the key leaves out up to 24 bytes,
//! byte by byte beyond.

/// The key of a string: equal keys of strings of at most `EXACT` bytes mean
/// equal strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    len: usize,
    head: u64,
    tail: u64,
}

/// Strings up to this length are identified by their key alone.
const EXACT: usize = 16;

/// Reads 8 bytes as a number; `bytes` is exactly 8 long where called.
fn word(bytes: &[u8]) -> u64 {
    <[u8; 8]>::try_from(bytes).map_or(0, u64::from_le_bytes)
}

/// Reads 4 bytes as a number; `bytes` is exactly 4 long where called.
fn half(bytes: &[u8]) -> u64 {
    <[u8; 4]>::try_from(bytes).map_or(0, |b| u64::from(u32::from_le_bytes(b)))
}

impl Key {
    #[inline(always)]
    fn of(text: &str) -> Key {
        let bytes = text.as_bytes();
        let len = bytes.len();
        // INVARIANT: for len ≤ EXACT the loads together cover every byte, so
        // two strings of one length with equal keys are equal.
        let (head, tail) = match len {
            8.. => (word(&bytes[..8]), word(&bytes[len - 8..])),
            4..8 => (half(&bytes[..4]) | half(&bytes[len - 4..]) << 32, 0),
            1..4 => (
                u64::from(bytes[0]) | u64::from(bytes[len / 2]) << 8 | u64::from(bytes[len - 1]) << 16,
                0,
            ),
            0 => (0, 0),
        };
        Key { len, head, tail }
    }

    /// The key mixed into one word.
    #[inline(always)]
    fn mixed(&self) -> u64 {
        self.head ^ self.tail.rotate_left(29) ^ (self.len as u64)
    }
}

/// Whether two strings longer than `EXACT` with equal keys (so of one
/// length, with the same first and last 8 bytes) are equal. Up to 24 bytes,
/// as most capability ids are, one word between head and tail is left to
/// compare, without calling `memcmp`.
// Not inlined: attribute names and values are rarely that long, and the
// look-ups that inline this compare would grow for all of them.
#[inline(never)]
fn same_long(known: &str, text: &str) -> bool {
    let (known, text) = (known.as_bytes(), text.as_bytes());
    if known.len() <= 24 && known.len() == text.len() && known.len() >= 16 {
        word(&known[8..16]) == word(&text[8..16])
    } else {
        known == text
    }
}

/// The table position of an entry's keys, from the top bits of a
/// multiplication per key (Fibonacci hashing), which depend on every bit of
/// the mixed keys.
#[inline(always)]
fn position<const N: usize>(keys: &[Key; N], shift: u32) -> usize {
    let hash = keys.iter().fold(0u64, |hash, key| {
        (hash ^ key.mixed()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    (hash >> shift) as usize
}

/// A place of the table: an entry's keys and number, or `EMPTY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place<const N: usize> {
    keys: [Key; N],
    number: u32,
    /// Every string of the entry is at most `EXACT` bytes long, so keys
    /// equal to its keys are its strings.
    exact: bool,
}

/// The number of an unused place.
const EMPTY: u32 = u32::MAX;

/// The keys of an unused place: no string is that long, so no look-up's
/// keys equal them.
const UNUSED: Key = Key {
    len: usize::MAX,
    head: 0,
    tail: 0,
};

/// Distinct entries of `N` strings each (a capability id; an attribute's
/// name and value), each numbered by its position in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dictionary<const N: usize> {
    /// Per number, the entry's strings, read only to tell apart longer
    /// strings with equal keys.
    texts: Vec<[Box<str>; N]>,
    /// Open addressing with linear probing.
    /// INVARIANT: the length is a power of two, at least twice the entries,
    /// so a probe always reaches an empty place.
    table: Vec<Place<N>>,
    /// 64 − log2(table length).
    shift: u32,
}

impl<const N: usize> Default for Dictionary<N> {
    fn default() -> Self {
        Dictionary::new(std::iter::empty())
    }
}

impl<const N: usize> Dictionary<N> {
    /// The dictionary of `entries`, numbered in order. A repeated entry keeps
    /// the number of its first occurrence; callers pass distinct ones.
    pub(crate) fn new<'t>(entries: impl IntoIterator<Item = [&'t str; N]>) -> Self {
        let texts: Vec<[Box<str>; N]> = entries.into_iter().map(|entry| entry.map(Box::from)).collect();
        let size = (2 * texts.len()).next_power_of_two().max(2);
        let mut dictionary = Dictionary {
            texts: Vec::with_capacity(texts.len()),
            table: vec![
                Place {
                    keys: [UNUSED; N],
                    number: EMPTY,
                    exact: true,
                };
                size
            ],
            shift: 64 - size.trailing_zeros(),
        };
        let mask = size - 1;
        for entry in texts {
            // INVARIANT: fewer than 2^32 − 1 entries (a policy is far smaller).
            let number = u32::try_from(dictionary.texts.len()).unwrap_or(u32::MAX);
            let strings = entry.each_ref().map(|text| &**text);
            if dictionary.get(strings).is_none() {
                let keys = strings.map(Key::of);
                let mut at = position(&keys, dictionary.shift);
                while dictionary.table[at].number != EMPTY {
                    at = (at + 1) & mask;
                }
                let exact = keys.iter().all(|key| key.len <= EXACT);
                dictionary.table[at] = Place { keys, number, exact };
            }
            dictionary.texts.push(entry);
        }
        dictionary
    }

    /// The number of the entry `texts`, if it is in the dictionary.
    // Inlined: a request makes a handful of look-ups, and a call's register
    // saving and restoring would cost about as much as the look-up itself.
    #[inline(always)]
    pub(crate) fn get(&self, texts: [&str; N]) -> Option<usize> {
        // A loop rather than `texts.map(Key::of)`, whose closure the
        // compiler called out of line.
        let mut keys = [Key::of(""); N];
        for (key, text) in keys.iter_mut().zip(texts) {
            *key = Key::of(text);
        }
        let mask = self.table.len() - 1;
        let mut at = position(&keys, self.shift);
        loop {
            let place = self.table.get(at & mask)?;
            if place.keys == keys {
                let number = place.number as usize;
                // Read from the place, not worked out from the keys: it is
                // one byte of what the comparison just loaded.
                if place.exact
                    || self
                        .texts
                        .get(number)?
                        .iter()
                        .zip(texts)
                        .all(|(known, text)| same_long(known, text))
                {
                    return Some(number);
                }
            } else if place.number == EMPTY {
                return None;
            }
            at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_finds_its_number_and_no_other_string_does() {
        // Lengths 0–40 around every boundary of the key, strings differing
        // only in a middle byte or by trailing zero bytes, and long ones
        // sharing head, tail and length.
        let mut texts: Vec<String> = (0..=40).map(|n| "a".repeat(n)).collect();
        texts.extend((1..=17).map(|n| "\0".repeat(n)));
        texts.extend((1..=17).map(|n| format!("abcdefgh{}", "\0".repeat(n))));
        texts.extend((0..=40).map(|n| format!("{}b{}", "a".repeat(n / 2), "a".repeat(n - n / 2))));
        texts.extend(
            [
                "billing.invoice.read",
                "billing.invoice.write",
                "billing.x.invoice.read",
            ]
            .map(String::from),
        );
        texts.extend((0..200).map(|n| format!("head-of-a-long-{n:03}-same-tail")));
        let dictionary = Dictionary::new(texts.iter().map(|text| [text.as_str()]));
        for (number, text) in texts.iter().enumerate() {
            assert_eq!(dictionary.get([text]), Some(number), "{text:?}");
        }
        for absent in [
            "",
            "c",
            "ab",
            "aaaa-",
            "billing.invoice.reaf",
            "head-of-a-long-200-same-tail",
            "é",
        ] {
            assert_eq!(
                dictionary.get([absent]),
                texts.iter().position(|t| t == absent),
                "{absent:?}"
            );
        }
        assert_eq!(Dictionary::<1>::default().get([""]), None);
        // Pairs: an entry is its strings in order.
        let pairs = Dictionary::new(
            texts
                .iter()
                .zip(texts.iter().rev())
                .map(|(a, b)| [a.as_str(), b.as_str()]),
        );
        for (number, (a, b)) in texts.iter().zip(texts.iter().rev()).enumerate() {
            if texts[..number]
                .iter()
                .zip(texts.iter().rev())
                .all(|(x, y)| (x, y) != (a, b))
            {
                assert_eq!(pairs.get([a, b]), Some(number), "{a:?} {b:?}");
            }
        }
        assert_eq!(pairs.get(["a", "a"]), None);
    }
}
