//! Names people give tenants and apps: shown on dashboards and in audits, so they must read as
//! what they are.

/// The longest name, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// Why `name` (the value of `field`) is not a valid name: empty, too long, or holding control
/// characters or bidirectional overrides (which can make a name read as another).
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    let length = name.chars().count();
    if name.trim().is_empty() || length > MAX_NAME_CHARS {
        return Err(format!(
            "{field} must be 1 to {MAX_NAME_CHARS} characters, not blank (got {length})"
        ));
    }
    match name.chars().find(|&c| c.is_control() || is_bidi_control(c)) {
        Some(c) => Err(format!(
            "{field} must not hold control or bidirectional-override characters (found U+{:04X})",
            c as u32
        )),
        None => Ok(()),
    }
}

/// The Unicode bidirectional formatting characters (UAX #9): embeddings, overrides, isolates
/// and marks.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_free_of_control_and_bidi_characters() {
        assert_eq!(check_name("name", "vision-team ü"), Ok(()));
        assert!(check_name("name", "  ").is_err());
        assert!(check_name("name", &"x".repeat(MAX_NAME_CHARS + 1)).is_err());
        assert_eq!(check_name("name", &"é".repeat(MAX_NAME_CHARS)), Ok(()));
        for bad in ["evil\u{202E}gnp.exe", "a\u{2066}b", "tab\there", "nul\0"] {
            let refusal = check_name("name", bad).expect_err(bad);
            assert!(refusal.starts_with("name "), "{refusal}");
        }
    }
}
