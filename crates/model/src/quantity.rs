//! Parsing of human quantities in the Kubernetes style: `500m`, `2`, `1.5`, `16Gi`, `512M`.

use thiserror::Error;

/// Why a quantity string was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error("quantity is empty")]
    Empty,
    #[error("quantity `{0}` is negative; quantities must be zero or more")]
    Negative(String),
    #[error(
        "quantity `{0}` is not a number with an optional suffix (examples: 500m, 2, 1.5, 16Gi, 512M)"
    )]
    Malformed(String),
    #[error("quantity `{0}` is too large")]
    Overflow(String),
    #[error("quantity `{0}` has a fraction finer than this resource can express")]
    TooFine(String),
}

/// A decimal number split into integer and fraction digits, without a sign.
struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
}

fn split_number(s: &str) -> Result<(Decimal<'_>, &str), QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.starts_with('-') {
        return Err(QuantityError::Negative(s.to_string()));
    }
    let s2 = s.strip_prefix('+').unwrap_or(s);
    let end = s2
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s2.len());
    let (num, suffix) = s2.split_at(end);
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(QuantityError::Malformed(s.to_string()));
    }
    Ok((Decimal { int, frac }, suffix))
}

/// `value * scale` for a power-of-ten `scale`; fails if the result is not whole.
fn scaled(orig: &str, d: &Decimal<'_>, scale: u128) -> Result<u64, QuantityError> {
    let places = count_places(scale);
    if d.frac.len() > places && d.frac[places..].bytes().any(|b| b != b'0') {
        return Err(QuantityError::TooFine(orig.to_string()));
    }
    let frac = &d.frac[..d.frac.len().min(places)];
    let over = || QuantityError::Overflow(orig.to_string());
    let mut num: u128 = 0;
    for c in d.int.bytes().chain(frac.bytes()) {
        num = num
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(c - b'0')))
            .ok_or_else(over)?;
    }
    let pad = u32::try_from(places - frac.len()).map_err(|_| over())?;
    let total = num.checked_mul(10u128.pow(pad)).ok_or_else(over)?;
    u64::try_from(total).map_err(|_| over())
}

/// How many decimal places `scale` can express (number of trailing zeros of a power-of-ten part).
fn count_places(mut scale: u128) -> usize {
    let mut n = 0;
    while scale.is_multiple_of(10) && scale > 0 {
        scale /= 10;
        n += 1;
    }
    n
}

/// CPU in milli-cores: `500m` = 500, `2` = 2000, `1.5` = 1500.
pub fn parse_cpu_milli(s: &str) -> Result<u64, QuantityError> {
    parse_milli(s)
}

/// A quantity in thousandths: `500m` = 500, `2` = 2000, `0.25` = 250.
/// Used for CPU and for fractions of a GPU.
pub fn parse_milli(s: &str) -> Result<u64, QuantityError> {
    let (d, suffix) = split_number(s)?;
    match suffix {
        "m" => scaled(s, &d, 1),
        "" => scaled(s, &d, 1000),
        _ => Err(QuantityError::Malformed(s.to_string())),
    }
}

/// A plain count (GPUs, pods): a whole number, no suffix.
pub fn parse_count(s: &str) -> Result<u64, QuantityError> {
    let (d, suffix) = split_number(s)?;
    if !suffix.is_empty() {
        return Err(QuantityError::Malformed(s.to_string()));
    }
    scaled(s, &d, 1)
}

/// Bytes, with Kubernetes suffixes: `Ki Mi Gi Ti Pi Ei` (powers of 1024) and
/// `k K M G T P E` (powers of 1000); no suffix means bytes.
pub fn parse_bytes(s: &str) -> Result<u64, QuantityError> {
    let (d, suffix) = split_number(s)?;
    let scale: u128 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return Err(QuantityError::Malformed(s.to_string())),
    };
    scaled_any(s, &d, scale)
}

/// Like `scaled`, for scales that are not powers of ten (binary suffixes): the
/// fraction is applied exactly and must yield a whole number.
fn scaled_any(orig: &str, d: &Decimal<'_>, scale: u128) -> Result<u64, QuantityError> {
    let over = || QuantityError::Overflow(orig.to_string());
    let digits: String = format!("{}{}", d.int, d.frac);
    let digits = digits.trim_start_matches('0');
    let mut num: u128 = 0;
    for c in digits.bytes() {
        num = num
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(c - b'0')))
            .ok_or_else(over)?;
    }
    let den: u128 = 10u128
        .checked_pow(u32::try_from(d.frac.len()).map_err(|_| over())?)
        .ok_or_else(over)?;
    let prod = num.checked_mul(scale).ok_or_else(over)?;
    if prod % den != 0 {
        return Err(QuantityError::TooFine(orig.to_string()));
    }
    u64::try_from(prod / den).map_err(|_| over())
}

/// Renders bytes the way people read them: `16Gi`, `512Mi`, `1500`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
        ("", 1),
    ];
    if b == 0 {
        return "0".into();
    }
    for (u, s) in UNITS {
        if b >= s && b.is_multiple_of(s) {
            return format!("{}{u}", b / s);
        }
    }
    b.to_string()
}

/// Renders thousandths: `1500` milli as `1.5`, `250` as `250m`.
pub fn format_milli(m: u64) -> String {
    if m.is_multiple_of(1000) {
        format!("{}", m / 1000)
    } else if m < 1000 {
        format!("{m}m")
    } else {
        let s = format!("{}.{:03}", m / 1000, m % 1000);
        s.trim_end_matches('0').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu_milli("500m"), Ok(500));
        assert_eq!(parse_cpu_milli("2"), Ok(2000));
        assert_eq!(parse_cpu_milli("1.5"), Ok(1500));
        assert_eq!(parse_cpu_milli("0.001"), Ok(1));
        assert_eq!(parse_cpu_milli(".5"), Ok(500));
        assert!(matches!(
            parse_cpu_milli("0.0005"),
            Err(QuantityError::TooFine(_))
        ));
        assert!(matches!(
            parse_cpu_milli("-1"),
            Err(QuantityError::Negative(_))
        ));
        assert!(matches!(
            parse_cpu_milli("abc"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_cpu_milli("1.2.3"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(parse_cpu_milli(""), Err(QuantityError::Empty)));
        assert!(matches!(
            parse_cpu_milli("99999999999999999999999"),
            Err(QuantityError::Overflow(_))
        ));
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("16Gi"), Ok(16 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("512M"), Ok(512_000_000));
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert!(matches!(parse_bytes("0.5"), Err(QuantityError::TooFine(_))));
        assert!(matches!(
            parse_bytes("1Xi"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("100Ei"),
            Err(QuantityError::Overflow(_))
        ));
    }

    #[test]
    fn counts_and_formats() {
        assert_eq!(parse_count("8"), Ok(8));
        assert!(parse_count("8m").is_err());
        assert!(parse_count("1.5").is_err());
        assert_eq!(format_bytes(16 << 30), "16Gi");
        assert_eq!(format_bytes(1500), "1500");
        assert_eq!(format_milli(1500), "1.5");
        assert_eq!(format_milli(250), "250m");
        assert_eq!(format_milli(3000), "3");
    }

    proptest::proptest! {
        #[test]
        fn milli_roundtrip(m in 0u64..10_000_000) {
            proptest::prop_assert_eq!(parse_milli(&format_milli(m)), Ok(m));
        }
        #[test]
        fn bytes_roundtrip(b in 0u64..(1u64 << 50)) {
            proptest::prop_assert_eq!(parse_bytes(&format_bytes(b)), Ok(b));
        }
        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = parse_bytes(&s);
            let _ = parse_milli(&s);
            let _ = parse_count(&s);
        }
    }
}
