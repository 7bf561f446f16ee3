//! RFC 6901 JSON pointers: how a decision or a diagnostic says *where* in the
//! artifact (docs/reference.md#pointers-and-positions). Built from parts with `~` and `/` escaped.

/// Escapes one segment: `~` → `~0`, `/` → `~1`.
pub fn escape(segment: &str) -> String {
    if segment.contains(['~', '/']) {
        segment.replace('~', "~0").replace('/', "~1")
    } else {
        segment.to_owned()
    }
}

/// Appends one segment to `pointer`: `/` and the segment, escaped. Most
/// segments need no escaping and are copied as they are.
pub fn push(pointer: &mut String, segment: &str) {
    pointer.push('/');
    if segment.contains(['~', '/']) {
        pointer.push_str(&escape(segment));
    } else {
        pointer.push_str(segment);
    }
}

/// Builds a pointer from segments: `join(["grants", "0"])` is `/grants/0`.
pub fn join<I, S>(segments: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    for segment in segments {
        push(&mut out, segment.as_ref());
    }
    out
}

/// Splits a pointer into unescaped segments. A leading `#` is tolerated;
/// `""` and `"/"` are the root.
pub fn segments(pointer: &str) -> Vec<String> {
    let trimmed = pointer.strip_prefix('#').unwrap_or(pointer);
    if trimmed.is_empty() || trimmed == "/" {
        return Vec::new();
    }
    trimmed
        .split('/')
        .skip(1)
        .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_unescapes() {
        assert_eq!(join(["grants", "0", "a/b"]), "/grants/0/a~1b");
        assert_eq!(join(["x~y"]), "/x~0y");
        assert_eq!(segments("/grants/0/a~1b"), ["grants", "0", "a/b"]);
        assert_eq!(segments("#/x~0y"), ["x~y"]);
        assert_eq!(segments("~01"), Vec::<String>::new());
        assert_eq!(segments("/a/~01"), ["a", "~1"]);
        assert!(segments("/").is_empty());
    }
}
