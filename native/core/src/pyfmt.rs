//! Python's float formatting where the messages use it: `f"{x:g}"` and `round(x, 2)`, so the
//! native core's explanations are the same strings as the Python core's.

/// `format(x, "g")`: 6 significant digits, trailing zeros dropped, exponent form below 1e-4
/// and from 1e6 on.
pub fn fmt_g(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".to_string() } else { "-inf".to_string() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".to_string() } else { "0".to_string() };
    }
    // the exponent of x rounded to 6 significant digits decides the form
    let sci = format!("{:.5e}", x);
    let (mantissa, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    if (-4..6).contains(&exp) {
        let fixed = format!("{:.*}", (5 - exp) as usize, x);
        strip_zeros(&fixed)
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{}{:02}", strip_zeros(mantissa), sign, exp.abs())
    }
}

fn strip_zeros(text: &str) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text.to_string()
    }
}

/// `round(x, 2)`: the float nearest to x correctly rounded to 2 decimals.
pub fn round2(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    let text = format!("{:.2}", x);
    text.parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_format_matches_python() {
        let cases = [
            (0.2, "0.2"),
            (0.268, "0.268"),
            (12.0, "12"),
            (1e6, "1e+06"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (2.0 / 3.0, "0.666667"),
            (1024.0, "1024"),
            (999999.5, "1e+06"),
        ];
        for (x, want) in cases {
            assert_eq!(fmt_g(x), want, "{x}");
        }
    }

    #[test]
    fn round2_matches_python() {
        assert_eq!(round2(2.675), 2.67); // 2.675 is below the tie in binary
        assert_eq!(round2(0.125), 0.12);
        assert_eq!(round2(1.0 / 3.0), 0.33);
    }
}
