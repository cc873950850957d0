//! Fixture crate for the grader-parity corpus: pass, fail, ignore, should_panic.

pub fn add(a: i32, b: i32) -> i32 {
    a + b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds() {
        assert_eq!(add(2, 2), 4);
    }

    #[test]
    fn adds_wrong() {
        assert_eq!(add(2, 2), 5);
    }

    #[test]
    #[ignore]
    fn slow_case() {}

    #[test]
    #[should_panic(expected = "boom")]
    fn panics() {
        panic!("boom");
    }
}
