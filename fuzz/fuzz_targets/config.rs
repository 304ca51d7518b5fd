//! The config loader on arbitrary text: it never panics, and every error it
//! reports names the file and a line and column in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use weir::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = Config::parse(Path::new("fuzz.toml"), src) {
        let text = errors.to_string();
        assert!(!text.is_empty());
        for line in text.lines().filter(|l| l.starts_with("error: ")) {
            assert!(
                line.starts_with("error: fuzz.toml"),
                "an error without its place: {line}\n--- input ---\n{src}"
            );
        }
    }
});
