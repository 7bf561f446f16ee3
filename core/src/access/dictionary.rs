//! A dictionary from a policy's strings — capability and issuer ids, an
//! attribute's name and value together — to their numbers, built once with
//! the ruleset and looked up on every request.
//!
//! The strings a request brings are short (a claim value, an attribute name,
//! a capability id), and a general-purpose map spends most of a look-up
//! hashing them byte by byte and calling `memcmp`. Here a string's *key* is
//! its length and two 8-byte words loaded from its head and its tail, which
//! for 16 bytes or fewer *is* the string (the words cover every byte); the
//! keys of an entry's strings are hashed by a multiplication each into an
//! open-addressed table at most half full, and compared as integers. Only
//! strings longer than 16 bytes whose keys are equal are compared byte by
//! byte.

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

/// Distinct entries of `N` strings each (a capability id; an attribute's
/// name and value), each numbered by its position in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dictionary<const N: usize> {
    texts: Vec<[Box<str>; N]>,
    keys: Vec<[Key; N]>,
    /// Open addressing with linear probing: 0 is empty, `n + 1` is entry `n`.
    /// INVARIANT: the length is a power of two, at least twice the entries,
    /// so a probe always reaches an empty slot.
    table: Vec<u32>,
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
            keys: texts
                .iter()
                .map(|entry| entry.each_ref().map(|text| Key::of(text)))
                .collect(),
            texts,
            table: vec![0; size],
            shift: 64 - size.trailing_zeros(),
        };
        let mask = size - 1;
        for number in 0..dictionary.texts.len() {
            if dictionary
                .get(dictionary.texts[number].each_ref().map(|text| &**text))
                .is_some()
            {
                continue;
            }
            let mut at = position(&dictionary.keys[number], dictionary.shift);
            while dictionary.table[at] != 0 {
                at = (at + 1) & mask;
            }
            // INVARIANT: fewer than 2^32 − 1 entries (a policy is far smaller).
            dictionary.table[at] = u32::try_from(number + 1).unwrap_or(u32::MAX);
        }
        dictionary
    }

    /// The number of the entry `texts`, if it is in the dictionary.
    // Inlined: a request makes a handful of look-ups, and a call's register
    // saving and restoring would cost about as much as the look-up itself.
    #[inline(always)]
    pub(crate) fn get(&self, texts: [&str; N]) -> Option<usize> {
        let keys = texts.map(Key::of);
        let mask = self.table.len() - 1;
        let mut at = position(&keys, self.shift);
        loop {
            let number = (self.table[at] as usize).checked_sub(1)?;
            if self.keys[number] == keys
                && keys
                    .iter()
                    .zip(&self.texts[number])
                    .zip(texts)
                    .all(|((key, known), text)| key.len <= EXACT || **known == *text)
            {
                return Some(number);
            }
            at = (at + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_finds_its_number_and_no_other_string_does() {
        // Lengths 0–40 around every boundary of the key, strings differing
        // only in a middle byte, and long ones sharing head, tail and length.
        let mut texts: Vec<String> = (0..=40).map(|n| "a".repeat(n)).collect();
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
