//! JPEG frames: checking what a source sent (without decoding it), and
//! fitting an image to a bound (decode, downscale, encode). Pure functions
//! on bytes; the codecs are `zune-jpeg` (decode) and `jpeg-encoder`.

use super::health::Rejection;

/// Why bytes are not a usable frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FrameError {
    pub why: Rejection,
    pub message: String,
}

impl FrameError {
    pub fn new(why: Rejection, message: impl Into<String>) -> FrameError {
        FrameError {
            why,
            message: message.into(),
        }
    }
}

/// Bytes after the end-of-image marker that are still taken (padding some
/// cameras send).
const TRAILING_SLACK: usize = 16;
/// Largest picture rozd decodes, either side.
pub const MAX_DECODE_EDGE: u32 = 8192;

/// Checks that `data` is one whole baseline or progressive JPEG no larger
/// than `max_bytes` and returns its (width, height). Only the markers are
/// read, not the picture.
pub fn check(data: &[u8], max_bytes: usize) -> Result<(u32, u32), FrameError> {
    if data.len() > max_bytes {
        return Err(FrameError::new(
            Rejection::Oversized,
            format!("a frame of {} bytes exceeds max_frame_kb", data.len()),
        ));
    }
    if !data.starts_with(&[0xFF, 0xD8]) {
        return Err(FrameError::new(
            Rejection::Garbage,
            "a frame that is not a JPEG (no start-of-image marker)",
        ));
    }
    let tail = &data[data.len().saturating_sub(TRAILING_SLACK + 2)..];
    if !tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        return Err(FrameError::new(
            Rejection::Truncated,
            "a JPEG without its end-of-image marker (cut off)",
        ));
    }
    match dimensions(data) {
        Some((w, h)) if w > 0 && h > 0 => Ok((w, h)),
        _ => Err(FrameError::new(
            Rejection::Garbage,
            "a JPEG without a readable frame header",
        )),
    }
}

/// The (width, height) of a JPEG from its start-of-frame marker, without
/// decoding it; `None` when there is none before the first scan.
pub fn dimensions(data: &[u8]) -> Option<(u32, u32)> {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut i = 2;
    loop {
        // Markers may be preceded by fill bytes 0xFF.
        if *data.get(i)? != 0xFF {
            return None;
        }
        while *data.get(i)? == 0xFF {
            i += 1;
        }
        let marker = *data.get(i)?;
        i += 1;
        match marker {
            // Standalone markers: no length.
            0x01 | 0xD0..=0xD7 => continue,
            // Start of scan before any frame header, or end of image.
            0xDA | 0xD9 => return None,
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([*data.get(i)?, *data.get(i + 1)?]));
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof {
            let h = u16::from_be_bytes([*data.get(i + 3)?, *data.get(i + 4)?]);
            let w = u16::from_be_bytes([*data.get(i + 5)?, *data.get(i + 6)?]);
            return Some((u32::from(w), u32::from(h)));
        }
        if len < 2 {
            return None;
        }
        i += len;
    }
}

/// An image fitted to its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    pub jpeg: Vec<u8>,
    pub width: u32,
    pub height: u32,
    /// Whether it was decoded and encoded again (else: the bytes as given).
    pub reencoded: bool,
}

/// `jpeg` with its long edge at most `max_edge` pixels and at most
/// `max_bytes` bytes: passed through untouched when it already fits, else
/// decoded, downscaled (area average) and encoded at `quality`, then at
/// lower qualities and sizes until it fits.
pub fn fit(
    jpeg: &[u8],
    max_edge: u32,
    max_bytes: usize,
    quality: u8,
) -> Result<Fitted, FrameError> {
    let (width, height) = check(jpeg, usize::MAX)?;
    if width.max(height) <= max_edge && jpeg.len() <= max_bytes {
        return Ok(Fitted {
            jpeg: jpeg.to_vec(),
            width,
            height,
            reencoded: false,
        });
    }
    let (rgb, width, height) = decode_rgb(jpeg)?;
    let mut edge = max_edge.min(width.max(height));
    let mut quality = quality.clamp(1, 100);
    // Bounded: at most a few qualities per size, sizes shrinking by a quarter.
    for _ in 0..24 {
        let (w, h) = scaled_size(width, height, edge);
        let small = if (w, h) == (width, height) {
            rgb.clone()
        } else {
            downscale(&rgb, width, height, w, h)
        };
        let jpeg = encode_rgb(&small, w, h, quality)?;
        if jpeg.len() <= max_bytes {
            return Ok(Fitted {
                jpeg,
                width: w,
                height: h,
                reencoded: true,
            });
        }
        if quality > 40 {
            quality -= 20;
        } else {
            edge = (edge * 3 / 4).max(16);
        }
    }
    Err(FrameError::new(
        Rejection::Oversized,
        format!("cannot fit the image into {max_bytes} bytes"),
    ))
}

/// The size with the long edge at most `edge`, keeping the aspect ratio.
pub fn scaled_size(width: u32, height: u32, edge: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= edge {
        return (width, height);
    }
    let scale = f64::from(edge) / f64::from(long);
    let w = ((f64::from(width) * scale).round() as u32).max(1);
    let h = ((f64::from(height) * scale).round() as u32).max(1);
    (w, h)
}

/// Decodes a JPEG to RGB (8 bits each), refusing pictures larger than
/// [`MAX_DECODE_EDGE`] either side.
pub fn decode_rgb(jpeg: &[u8]) -> Result<(Vec<u8>, u32, u32), FrameError> {
    use zune_jpeg::zune_core::bytestream::ZCursor;
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let options = DecoderOptions::default()
        .set_max_width(MAX_DECODE_EDGE as usize)
        .set_max_height(MAX_DECODE_EDGE as usize)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(jpeg), options);
    let pixels = decoder
        .decode()
        .map_err(|e| FrameError::new(Rejection::Garbage, format!("cannot decode the JPEG: {e}")))?;
    let info = decoder
        .info()
        .ok_or_else(|| FrameError::new(Rejection::Garbage, "a JPEG without a size"))?;
    let (w, h) = (u32::from(info.width), u32::from(info.height));
    if pixels.len() != w as usize * h as usize * 3 {
        return Err(FrameError::new(
            Rejection::Garbage,
            "the decoded JPEG is not RGB",
        ));
    }
    Ok((pixels, w, h))
}

/// Encodes RGB pixels (8 bits each, row by row) as a JPEG.
pub fn encode_rgb(rgb: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, FrameError> {
    let (Ok(w), Ok(h)) = (u16::try_from(width), u16::try_from(height)) else {
        return Err(FrameError::new(
            Rejection::Oversized,
            "a picture too large to encode",
        ));
    };
    let mut out = Vec::with_capacity(rgb.len() / 10);
    let encoder = jpeg_encoder::Encoder::new(&mut out, quality.clamp(1, 100));
    encoder
        .encode(rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| FrameError::new(Rejection::Garbage, format!("cannot encode the JPEG: {e}")))?;
    Ok(out)
}

/// Area-average downscale of RGB pixels to `w` × `h` (each at most the source's).
pub fn downscale(rgb: &[u8], width: u32, height: u32, w: u32, h: u32) -> Vec<u8> {
    let (width, height, w, h) = (width as usize, height as usize, w as usize, h as usize);
    let mut out = vec![0u8; w * h * 3];
    for oy in 0..h {
        let y0 = oy * height / h;
        let y1 = ((oy + 1) * height / h).max(y0 + 1).min(height);
        for ox in 0..w {
            let x0 = ox * width / w;
            let x1 = ((ox + 1) * width / w).max(x0 + 1).min(width);
            let mut sum = [0u32; 3];
            for y in y0..y1 {
                let row = &rgb[(y * width + x0) * 3..(y * width + x1) * 3];
                for px in row.chunks_exact(3) {
                    sum[0] += u32::from(px[0]);
                    sum[1] += u32::from(px[1]);
                    sum[2] += u32::from(px[2]);
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as u32;
            let o = (oy * w + ox) * 3;
            for c in 0..3 {
                out[o + c] = ((sum[c] + n / 2) / n) as u8;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test picture: a horizontal gradient with a red square.
    pub(crate) fn picture(w: u32, h: u32) -> Vec<u8> {
        let mut rgb = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                let square = x < w / 4 && y < h / 4;
                rgb.extend_from_slice(&if square {
                    [220, 20, 20]
                } else {
                    [(x * 255 / w) as u8, 128, (y * 255 / h) as u8]
                });
            }
        }
        rgb
    }

    #[test]
    fn a_jpeg_is_checked_by_its_markers() {
        let jpeg = encode_rgb(&picture(64, 48), 64, 48, 80).unwrap();
        assert_eq!(check(&jpeg, 1 << 20), Ok((64, 48)));
        assert_eq!(dimensions(&jpeg), Some((64, 48)));
        let why = |data: &[u8], max| check(data, max).unwrap_err().why;
        assert_eq!(why(&jpeg, 100), Rejection::Oversized);
        assert_eq!(
            why(b"hello, this is no picture", 1 << 20),
            Rejection::Garbage
        );
        assert_eq!(why(&jpeg[..jpeg.len() / 2], 1 << 20), Rejection::Truncated);
        assert_eq!(why(&[0xFF, 0xD8, 0xFF, 0xD9], 1 << 20), Rejection::Garbage);
        let mut padded = jpeg.clone();
        padded.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            check(&padded, 1 << 20),
            Ok((64, 48)),
            "padding after the end"
        );
        assert_eq!(dimensions(&[0xFF, 0xD8, 0xFF]), None);
        assert_eq!(dimensions(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x00]), None);
    }

    #[test]
    fn fitting_passes_small_images_through_and_shrinks_large_ones() {
        let rgb = picture(640, 480);
        let jpeg = encode_rgb(&rgb, 640, 480, 85).unwrap();
        let same = fit(&jpeg, 1568, 1 << 20, 80).unwrap();
        assert!(!same.reencoded);
        assert_eq!(same.jpeg, jpeg);
        let small = fit(&jpeg, 320, 1 << 20, 80).unwrap();
        assert!(small.reencoded);
        assert_eq!((small.width, small.height), (320, 240));
        let (pixels, w, h) = decode_rgb(&small.jpeg).unwrap();
        assert_eq!((w, h), (320, 240));
        // The red square survived the downscale (top-left corner).
        let px = &pixels[(10 * 320 + 10) * 3..(10 * 320 + 10) * 3 + 3];
        assert!(px[0] > 180 && px[1] < 70 && px[2] < 70, "{px:?}");
        let tight = fit(&jpeg, 1568, 6_000, 90).unwrap();
        assert!(tight.jpeg.len() <= 6_000, "{}", tight.jpeg.len());
        assert!(decode_rgb(&tight.jpeg).is_ok());
        assert_eq!(scaled_size(480, 640, 320), (240, 320));
        assert_eq!(scaled_size(100, 50, 320), (100, 50));
    }

    #[test]
    fn undecodable_input_is_an_error_not_a_panic() {
        let jpeg = encode_rgb(&picture(64, 48), 64, 48, 80).unwrap();
        let mut broken = jpeg.clone();
        for b in broken.iter_mut().skip(200).take(300) {
            *b = 0x5A;
        }
        // Whatever it decodes to, it does not panic; the markers still check.
        let _ = decode_rgb(&broken);
        assert!(decode_rgb(b"\xFF\xD8garbage\xFF\xD9").is_err());
    }
}
