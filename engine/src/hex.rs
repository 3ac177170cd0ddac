//! Hex text for bytes kept in JSON files (dead letters, the broker's saved state).

/// Lower-case hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// The bytes of hex `text`; pairs that are not hex (a damaged file) are skipped rather
/// than failing the whole read.
pub fn decode(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .filter_map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_damage() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(super::encode(&bytes), "00017f80ff");
        assert_eq!(super::decode(&super::encode(&bytes)), bytes);
        assert_eq!(super::decode("zz01é"), vec![1]);
    }
}
