//! Hand-built protobuf bytes for the wire-contract suites: what a client
//! built from the published `.proto` files would send, field by field.

/// A length-delimited field: key (field << 3 | 2), length, payload.
pub fn ld(field: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(u64::from(field << 3 | 2), &mut out);
    prost::encoding::encode_varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// A varint field: key (field << 3 | 0), value.
pub fn varint(field: u32, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(u64::from(field << 3), &mut out);
    prost::encoding::encode_varint(value, &mut out);
    out
}
