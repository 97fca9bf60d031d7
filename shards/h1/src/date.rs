//! Dates as HTTP writes them (RFC 9110 §5.6.7, IMF-fixdate), and the calendar arithmetic
//! behind them.

/// Length of an IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub const LEN: usize = 29;

/// Formats `unix_seconds` as an IMF-fixdate.
pub fn imf_fixdate(unix_seconds: u64) -> [u8; LEN] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let days = unix_seconds / 86_400;
    let seconds_of_day = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);

    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    let two = |out: &mut [u8; LEN], at: usize, value: u64| {
        out[at] = b'0' + (value / 10 % 10) as u8;
        out[at + 1] = b'0' + (value % 10) as u8;
    };
    two(&mut out, 5, day);
    out[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    two(&mut out, 12, year / 100);
    two(&mut out, 14, year % 100);
    two(&mut out, 17, seconds_of_day / 3_600);
    two(&mut out, 20, seconds_of_day / 60 % 60);
    two(&mut out, 23, seconds_of_day % 60);
    out
}

/// Gregorian (year, month 1–12, day 1–31) of a day count since 1970-01-01: Howard Hinnant's
/// `civil_from_days`, in unsigned form (dates from the epoch on).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_format_as_rfc_examples() {
        assert_eq!(&imf_fixdate(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&imf_fixdate(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        // A leap day and the turn of a century year that is a leap year.
        assert_eq!(&imf_fixdate(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(
            &imf_fixdate(1_795_305_599),
            b"Sat, 21 Nov 2026 23:59:59 GMT"
        );
    }

    proptest::proptest! {
        /// Agrees with a day-by-day walk of the calendar for any second up to year 2500.
        #[test]
        fn civil_dates_match_a_calendar_walk(days in 0u64..193_000, second in 0u64..86_400) {
            let mut year = 1970u64;
            let mut left = days;
            loop {
                let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
                let length = if leap { 366 } else { 365 };
                if left < length { break; }
                left -= length;
                year += 1;
            }
            let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
            let lengths = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
            let mut month = 0;
            while left >= lengths[month] { left -= lengths[month]; month += 1; }
            let text = imf_fixdate(days * 86_400 + second);
            let text = std::str::from_utf8(&text).unwrap();
            let expected = format!("{:02} {} {}", left + 1, ["Jan","Feb","Mar","Apr","May","Jun","Jul","Aug","Sep","Oct","Nov","Dec"][month], year);
            proptest::prop_assert_eq!(&text[5..16], expected.as_str());
        }
    }
}
