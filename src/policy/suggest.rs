//! "Did you mean": the closest of a field's known values to one that is
//! not among them, for config errors (docs/reference/configuration.md#configuration-and-defaults).

/// The candidate closest to `word` by edit distance (case-insensitive),
/// when it is close enough to be a slip: at most 2 edits, and at most half
/// the word's length (one edit for a word of one to three letters).
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    let limit = (w.chars().count() / 2).clamp(1, 2);
    candidates
        .into_iter()
        .map(|c| (distance(&w, &c.to_ascii_lowercase()), c))
        .filter(|(d, _)| *d > 0 && *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "did you mean \"h2c\"? " when `word` is a slip away from one of
/// `known`, else nothing (the message goes on with what is expected).
pub fn hint<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    closest(word, known)
        .map(|c| format!("did you mean {c:?}? "))
        .unwrap_or_default()
}

/// Edit distance counting a swap of two neighbours as one edit (optimal
/// string alignment).
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slips_are_caught_and_strangers_are_not() {
        let kinds = [
            "connect-failure",
            "reset",
            "timeout",
            "5xx",
            "gateway-error",
        ];
        assert_eq!(closest("timout", kinds), Some("timeout"));
        assert_eq!(closest("TIMEOTU", kinds), Some("timeout"));
        assert_eq!(closest("rest", kinds), Some("reset"));
        assert_eq!(closest("connect_failure", kinds), Some("connect-failure"));
        assert_eq!(closest("banana", kinds), None);
        assert_eq!(closest("h2", ["h2c", "http1"]), Some("h2c"));
        assert_eq!(
            closest("ab", ["xy", "zz"]),
            None,
            "two edits in two letters is a stranger"
        );
        assert_eq!(
            closest("roundrobin", ["round_robin", "peak_ewma"]),
            Some("round_robin")
        );
    }
}
