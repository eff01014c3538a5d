//! C printf semantics that Rust's `format!` lacks, for the nccl-tests table: `%g`, `%.Ne`
//! (sign and at least two exponent digits) and nccl-tests' rule that shrinks a value's
//! precision to fit its column. Pure string formatting; no I/O.

/// C's `%.{prec}e`: `1.2e+03`, `-5.00e-07`.
pub fn exp(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return non_finite(v);
    }
    let s = format!("{v:.prec$e}");
    match s.split_once('e') {
        Some((mantissa, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// C's `%g` (precision 6): the shorter of `%f` and `%e` by C's rule, trailing zeros removed.
pub fn g(v: f64) -> String {
    g_prec(v, 6)
}

/// C's `%.{prec}g`.
pub fn g_prec(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return non_finite(v);
    }
    let p = prec.max(1);
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // The decimal exponent after rounding to p significant digits decides the style.
    let e_form = format!("{v:.*e}", p - 1);
    let x: i32 = e_form
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if x < -4 || x >= p as i32 {
        let s = exp(v, p - 1);
        match s.split_once('e') {
            Some((m, e)) => format!("{}e{e}", strip_zeros(m)),
            None => s,
        }
    } else {
        let decimals = (p as i32 - 1 - x).max(0) as usize;
        strip_zeros(&format!("{v:.decimals$}"))
    }
}

/// nccl-tests' column fit for `v` in a field of `width`: two decimals while the integer part
/// leaves room, then one, then none, then exponent form (`%*.1e` from width 7, else `%*.0e`).
pub fn fit(v: f64, width: usize) -> String {
    let digits = int_digits(v);
    if digits + 2 < width {
        format!("{v:>width$.2}")
    } else if digits + 1 < width {
        format!("{v:>width$.1}")
    } else if digits < width + 1 {
        format!("{v:>width$.0}")
    } else if width >= 7 {
        format!("{:>width$}", exp(v, 1))
    } else {
        format!("{:>width$}", exp(v, 0))
    }
}

/// Decimal digits of the integer part of `v`: the number of k ≥ 0 with 10^k ≤ v (0 below 1).
fn int_digits(v: f64) -> usize {
    let mut digits = 0;
    let mut power = 1.0;
    while power <= v && digits < 400 {
        digits += 1;
        power *= 10.0;
    }
    digits
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s.to_owned()
    }
}

fn non_finite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_matches_c() {
        // Expected strings are what glibc's printf("%g") prints.
        let cases: [(f64, &str); 20] = [
            (0.0, "0"),
            (1.0, "1"),
            (3.0, "3"),
            (0.5, "0.5"),
            (123.456, "123.456"),
            (123.4567, "123.457"),
            (100000.0, "100000"),
            (999999.0, "999999"),
            (999999.5, "1e+06"),
            (1000000.0, "1e+06"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (0.000123456789, "0.000123457"),
            (-2.5, "-2.5"),
            (1e100, "1e+100"),
            (12.0, "12"),
            (0.1, "0.1"),
            (2.0 / 3.0, "0.666667"),
            (9.9999996, "10"),
        ];
        for (v, want) in cases {
            assert_eq!(g(v), want, "%g of {v}");
        }
        assert_eq!(g(f64::NAN), "nan");
        assert_eq!(g(f64::INFINITY), "inf");
        assert_eq!(g_prec(1234.5, 3), "1.23e+03");
    }

    #[test]
    fn exp_has_a_sign_and_two_digits() {
        assert_eq!(exp(1234.0, 1), "1.2e+03");
        assert_eq!(exp(0.000123, 0), "1e-04");
        assert_eq!(exp(1.5e123, 1), "1.5e+123");
        assert_eq!(exp(-9.96, 1), "-1.0e+01");
    }

    #[test]
    fn fit_shrinks_precision_to_the_column() {
        // Widths as nccl-tests uses them: 7 for time, 6 for bandwidths.
        assert_eq!(fit(0.0, 6), "  0.00");
        assert_eq!(fit(0.004, 6), "  0.00");
        assert_eq!(fit(10.5, 7), "  10.50");
        assert_eq!(fit(1234.5, 7), "1234.50");
        assert_eq!(fit(12345.67, 7), "12345.7");
        assert_eq!(fit(123456.7, 7), " 123457");
        assert_eq!(fit(1234567.0, 7), "1234567");
        assert_eq!(fit(12345678.0, 7), "1.2e+07");
        assert_eq!(fit(123456789.0, 7), "1.2e+08");
        assert_eq!(fit(123.456, 6), "123.46");
        assert_eq!(fit(1234.5, 6), "1234.5");
        assert_eq!(fit(99999.9, 6), "100000");
        assert_eq!(fit(123456.0, 6), "123456");
        assert_eq!(fit(1234567.0, 6), " 1e+06");
        assert_eq!(fit(0.125, 6), "  0.12");
    }
}
