//! "Did you mean …?": the closest known name to one that is not known, when it is close enough
//! to be a typo (`capabilites` for `capabilities`, `crm__refnd` for `crm__refund`).
//!
//! Close enough is an edit distance (insertions, deletions, substitutions, and the swap of two
//! neighbours) of at most 1 for names of up to 4 characters, 2 up to 9, 3 beyond; the nearest
//! wins, the first given on a tie. A candidate whose length alone puts it too far is not compared.

/// The candidate a human most likely meant by `wanted`, if any is close enough.
pub fn closest<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = match wanted.chars().count() {
        0..=4 => 1,
        5..=9 => 2,
        _ => 3,
    };
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        let allowed = best.map_or(limit, |(distance, _)| distance.saturating_sub(1));
        if let Some(distance) = distance_within(wanted, candidate, allowed) {
            if distance > 0 && best.is_none_or(|(found, _)| distance < found) {
                best = Some((distance, candidate));
            }
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// " (did you mean `x`?)" for the closest candidate, or nothing.
pub fn did_you_mean<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    hint(closest(wanted, candidates))
}

/// " (did you mean `x`?)" for a name found, or nothing: the words every message appends.
pub fn hint(found: Option<&str>) -> String {
    found.map_or_else(String::new, |found| format!(" (did you mean `{found}`?)"))
}

/// The optimal-string-alignment distance between `a` and `b` if it is at most `limit`.
fn distance_within(a: &str, b: &str, limit: usize) -> Option<usize> {
    if a.chars().count().abs_diff(b.chars().count()) > limit {
        return None;
    }
    let distance = strsim::osa_distance(a, b);
    (distance <= limit).then_some(distance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_finds_its_name() {
        let keys = [
            "version",
            "capabilities",
            "upstreams",
            "accounts",
            "principals",
            "grants",
        ];
        assert_eq!(closest("capabilites", keys), Some("capabilities"));
        assert_eq!(closest("grnats", keys), Some("grants"));
        assert_eq!(
            closest("usin", ["to", "capabilities", "using", "limits"]),
            Some("using")
        );
        assert_eq!(
            closest("crm__refnd", ["crm__refund", "crm__read"]),
            Some("crm__refund")
        );
    }

    #[test]
    fn a_name_too_far_from_every_candidate_finds_nothing() {
        assert_eq!(closest("policies", ["version", "grants"]), None);
        assert_eq!(closest("xyz", ["abc"]), None);
        // An exact match is no suggestion: the name is known.
        assert_eq!(closest("grants", ["grants"]), None);
        assert_eq!(did_you_mean("zzzzzz", ["grants"]), "");
    }

    #[test]
    fn the_nearest_wins_and_ties_go_to_the_first() {
        assert_eq!(closest("limit", ["limits", "limit_s", "lim"]), Some("limits"));
        assert_eq!(closest("ab", ["ac", "ad"]), Some("ac"));
        assert_eq!(did_you_mean("usin", ["using"]), " (did you mean `using`?)");
    }

    #[test]
    fn distances_are_the_usual_ones() {
        let d = |a: &str, b: &str| distance_within(a, b, 10);
        assert_eq!(d("kitten", "sitting"), Some(3));
        assert_eq!(d("ab", "ba"), Some(1));
        assert_eq!(d("", "abc"), Some(3));
        assert_eq!(d("same", "same"), Some(0));
        assert_eq!(distance_within(&"a".repeat(20), &"b".repeat(20), 3), None);
    }
}
