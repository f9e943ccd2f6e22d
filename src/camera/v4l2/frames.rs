//! What a V4L2 device hands over, made into a camera frame (a whole JPEG):
//! pure functions on bytes, no I/O, no clock.
//!
//! - MJPEG: passed through as the camera encoded it (no decode, no
//!   re-encode), after the zero bytes some drivers leave after the
//!   end-of-image marker (they report the whole buffer as used) are cut
//!   off, and after the same marker check as every other source's frames
//!   ([`jpeg::check`]).
//! - YUYV (YUV 4:2:2, `Y0 Cb Y1 Cr` per two pixels): encoded to JPEG
//!   straight from its YCbCr (JPEG's own colour space, so there is no RGB
//!   step), through [`RANGE`]: cameras send studio range (Y 16–235,
//!   Cb/Cr 16–240) and JFIF means full range (0–255).
//!
//! A frame that is not usable is refused with its reason (a
//! [`FrameError`]) for the camera to count.

use bytes::Bytes;

// Re-exported: the benchmarks and tests build layouts without the config.
pub use crate::camera::config::PixelFormat;
use crate::camera::health::Rejection;
use crate::camera::jpeg::{self, FrameError};

/// A frame as the device delivered it: its used bytes, copied out of the
/// driver's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub data: Vec<u8>,
    /// The driver marked the buffer as damaged (`V4L2_BUF_FLAG_ERROR`:
    /// a USB transfer lost part of it).
    pub damaged: bool,
}

/// The picture layout the device agreed to (which may differ from the
/// one asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    /// Bytes from one row to the next (`bytesperline`; YUYV rows may be
    /// padded, MJPEG has none).
    pub stride: usize,
}

/// A frame ready for the camera: a whole JPEG and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub jpeg: Bytes,
    pub width: u32,
    pub height: u32,
}

/// The frame `raw` as a JPEG of at most `max_bytes` (`max_frame_kb`);
/// YUYV is encoded at `quality`.
pub fn to_jpeg(
    raw: RawFrame,
    layout: &Layout,
    quality: u8,
    max_bytes: usize,
) -> Result<Encoded, FrameError> {
    if raw.damaged {
        return Err(FrameError::new(
            Rejection::Garbage,
            "the driver marked the frame as damaged (part of it was lost in transfer)",
        ));
    }
    match layout.format {
        PixelFormat::Mjpeg => mjpeg(raw.data, max_bytes),
        PixelFormat::Yuyv => {
            let jpeg = yuyv_to_jpeg(&raw.data, layout, quality)?;
            if jpeg.len() > max_bytes {
                return Err(FrameError::new(
                    Rejection::Oversized,
                    format!(
                        "a frame of {} bytes once encoded exceeds max_frame_kb",
                        jpeg.len()
                    ),
                ));
            }
            Ok(Encoded {
                jpeg: Bytes::from(jpeg),
                width: layout.width,
                height: layout.height,
            })
        }
    }
}

/// An MJPEG frame passed through: its trailing zero padding cut off,
/// then checked like any camera's JPEG.
pub fn mjpeg(mut data: Vec<u8>, max_bytes: usize) -> Result<Encoded, FrameError> {
    data.truncate(without_padding(&data).len());
    if data.is_empty() {
        return Err(FrameError::new(
            Rejection::Truncated,
            "an empty frame (the driver delivered no bytes, or only zeros)",
        ));
    }
    let (width, height) = jpeg::check(&data, max_bytes)?;
    // A driver that reported its whole buffer as used leaves an allocation
    // far larger than the frame: keep only the frame (it is held as the
    // latest one).
    let jpeg = if data.capacity() > 2 * data.len() {
        Bytes::copy_from_slice(&data)
    } else {
        Bytes::from(data)
    };
    Ok(Encoded {
        jpeg,
        width,
        height,
    })
}

/// `data` without the zero bytes at its end.
pub fn without_padding(data: &[u8]) -> &[u8] {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &data[..end]
}

/// Studio range to full range, for luma and for chroma.
#[derive(Debug)]
pub struct RangeTable {
    pub luma: [u8; 256],
    pub chroma: [u8; 256],
}

/// Y 16–235 → 0–255 and Cb/Cr 16–240 → 0–255 (ITU-R BT.601 studio range
/// to JFIF's full range), clamped outside the studio range.
pub static RANGE: RangeTable = RangeTable {
    luma: stretch(16, 235),
    chroma: stretch(16, 240),
};

/// The table that maps `low..=high` linearly onto 0–255 (rounded) and
/// clamps what lies outside.
const fn stretch(low: i32, high: i32) -> [u8; 256] {
    let mut table = [0u8; 256];
    let span = high - low;
    let mut v = 0;
    while v < 256 {
        let scaled = ((v - low) * 255 * 2 + span) / (2 * span);
        let clamped = if v <= low {
            0
        } else if v >= high {
            255
        } else {
            scaled
        };
        table[v as usize] = clamped as u8;
        v += 1;
    }
    table
}

/// Encodes a YUYV frame of `layout` as a JPEG at `quality`.
pub fn yuyv_to_jpeg(data: &[u8], layout: &Layout, quality: u8) -> Result<Vec<u8>, FrameError> {
    let image = YuyvImage::new(data, layout)?;
    let mut out = Vec::with_capacity(data.len() / 8);
    jpeg_encoder::Encoder::new(&mut out, quality.clamp(1, 100))
        .encode_image(image)
        .map_err(|e| {
            FrameError::new(
                Rejection::Garbage,
                format!("cannot encode the YUYV frame: {e}"),
            )
        })?;
    Ok(out)
}

/// A checked YUYV frame, as the encoder reads it: row by row, each pixel's
/// Y with its pair's Cb and Cr, through [`RANGE`].
struct YuyvImage<'a> {
    data: &'a [u8],
    width: u16,
    height: u16,
    stride: usize,
}

impl<'a> YuyvImage<'a> {
    fn new(data: &'a [u8], layout: &Layout) -> Result<YuyvImage<'a>, FrameError> {
        let (Ok(width), Ok(height)) = (u16::try_from(layout.width), u16::try_from(layout.height))
        else {
            return Err(FrameError::new(
                Rejection::Oversized,
                format!(
                    "a {}x{} frame is too large to encode",
                    layout.width, layout.height
                ),
            ));
        };
        if width == 0 || height == 0 || width % 2 != 0 {
            return Err(FrameError::new(
                Rejection::Garbage,
                format!(
                    "a YUYV frame must have an even width and a height ({}x{})",
                    layout.width, layout.height
                ),
            ));
        }
        let row = usize::from(width) * 2;
        let stride = layout.stride.max(row);
        // The stride is the driver's word: checked, so that a bogus one is
        // a refused frame, not an overflow (a 32-bit Pi has 32-bit sizes).
        let Some(needed) = stride
            .checked_mul(usize::from(height) - 1)
            .and_then(|rows| rows.checked_add(row))
        else {
            return Err(FrameError::new(
                Rejection::Garbage,
                format!("a YUYV row stride of {stride} bytes is not plausible"),
            ));
        };
        if data.len() < needed {
            return Err(FrameError::new(
                Rejection::Truncated,
                format!(
                    "a YUYV frame of {} bytes, where {}x{} needs {needed}",
                    data.len(),
                    layout.width,
                    layout.height
                ),
            ));
        }
        Ok(YuyvImage {
            data,
            width,
            height,
            stride,
        })
    }
}

impl jpeg_encoder::ImageBuffer for YuyvImage<'_> {
    fn get_jpeg_color_type(&self) -> jpeg_encoder::JpegColorType {
        jpeg_encoder::JpegColorType::Ycbcr
    }

    fn width(&self) -> u16 {
        self.width
    }

    fn height(&self) -> u16 {
        self.height
    }

    fn fill_buffers(&self, y: u16, buffers: &mut [Vec<u8>; 4]) {
        let start = usize::from(y) * self.stride;
        // In bounds: `new` checked the length for every row.
        let row = &self.data[start..start + usize::from(self.width) * 2];
        let [luma, cb, cr, _] = buffers;
        for pair in row.chunks_exact(4) {
            let (u, v) = (
                RANGE.chroma[usize::from(pair[1])],
                RANGE.chroma[usize::from(pair[3])],
            );
            luma.push(RANGE.luma[usize::from(pair[0])]);
            luma.push(RANGE.luma[usize::from(pair[2])]);
            cb.extend_from_slice(&[u, u]);
            cr.extend_from_slice(&[v, v]);
        }
    }
}

/// RGB pixels (8 bits each) as a studio-range YUYV frame, the way a camera
/// sends one (each pair's chroma averaged): recorded-like frames for the
/// tests and the benchmark.
pub fn yuyv_from_rgb(rgb: &[u8], width: u32, height: u32) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut out = Vec::with_capacity(w * h * 2);
    let studio = |r: f64, g: f64, b: f64| {
        let y = 16.0 + (65.481 * r + 128.553 * g + 24.966 * b) / 255.0;
        let cb = 128.0 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255.0;
        let cr = 128.0 + (112.0 * r - 93.786 * g - 18.214 * b) / 255.0;
        (y, cb, cr)
    };
    let byte = |v: f64| v.round().clamp(0.0, 255.0) as u8;
    for row in rgb.chunks_exact(w * 3).take(h) {
        for pair in row.chunks_exact(6) {
            let px = |i: usize| {
                studio(
                    f64::from(pair[i]),
                    f64::from(pair[i + 1]),
                    f64::from(pair[i + 2]),
                )
            };
            let (y0, cb0, cr0) = px(0);
            let (y1, cb1, cr1) = px(3);
            out.extend_from_slice(&[
                byte(y0),
                byte((cb0 + cb1) / 2.0),
                byte(y1),
                byte((cr0 + cr1) / 2.0),
            ]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::jpeg::{decode_rgb, encode_rgb};

    const COLOURS: [[u8; 3]; 4] = [[220, 30, 30], [30, 200, 40], [40, 60, 210], [240, 240, 240]];

    /// Four vertical bands of [`COLOURS`].
    fn bands(w: u32, h: u32) -> Vec<u8> {
        let mut rgb = Vec::with_capacity((w * h * 3) as usize);
        for _ in 0..h {
            for x in 0..w {
                rgb.extend_from_slice(&COLOURS[(x * 4 / w) as usize]);
            }
        }
        rgb
    }

    fn layout(format: PixelFormat, width: u32, height: u32) -> Layout {
        Layout {
            format,
            width,
            height,
            stride: if format == PixelFormat::Yuyv {
                width as usize * 2
            } else {
                0
            },
        }
    }

    fn raw(data: Vec<u8>) -> RawFrame {
        RawFrame {
            data,
            damaged: false,
        }
    }

    fn close(a: &[u8], b: &[u8; 3], within: u8) -> bool {
        a.iter().zip(b).all(|(x, y)| x.abs_diff(*y) <= within)
    }

    #[test]
    fn the_range_table_stretches_studio_range_to_full_range() {
        assert_eq!(RANGE.luma[16], 0);
        assert_eq!(RANGE.luma[235], 255);
        assert_eq!(RANGE.luma[0], 0, "below the range: clamped");
        assert_eq!(RANGE.luma[250], 255, "above the range: clamped");
        assert_eq!(RANGE.luma[126], 128, "the middle stays the middle");
        assert_eq!(RANGE.chroma[16], 0);
        assert_eq!(RANGE.chroma[240], 255);
        assert_eq!(RANGE.chroma[128], 128, "no colour stays no colour");
        assert!(RANGE.luma.windows(2).all(|w| w[0] <= w[1]), "monotonic");
        assert!(RANGE.chroma.windows(2).all(|w| w[0] <= w[1]), "monotonic");
    }

    #[test]
    fn a_yuyv_frame_encodes_to_a_jpeg_of_its_colours() {
        let (w, h) = (64, 48);
        let yuyv = yuyv_from_rgb(&bands(w, h), w, h);
        assert_eq!(yuyv.len(), (w * h * 2) as usize);
        let frame = to_jpeg(raw(yuyv), &layout(PixelFormat::Yuyv, w, h), 90, 1 << 20).unwrap();
        assert_eq!((frame.width, frame.height), (w, h));
        assert_eq!(jpeg::check(&frame.jpeg, 1 << 20), Ok((w, h)));
        let (pixels, dw, dh) = decode_rgb(&frame.jpeg).unwrap();
        assert_eq!((dw, dh), (w, h));
        for (band, colour) in COLOURS.iter().enumerate() {
            // The middle of each band, away from the edges JPEG blurs.
            let x = band as u32 * w / 4 + w / 8;
            let i = ((h / 2 * w + x) * 3) as usize;
            let px = &pixels[i..i + 3];
            assert!(close(px, colour, 10), "band {band}: {px:?} for {colour:?}");
        }
    }

    #[test]
    fn yuyv_rows_may_be_padded() {
        let (w, h) = (32, 16);
        let tight = yuyv_from_rgb(&bands(w, h), w, h);
        let stride = w as usize * 2 + 24;
        let mut padded = Vec::new();
        for row in tight.chunks_exact(w as usize * 2) {
            padded.extend_from_slice(row);
            padded.extend_from_slice(&[0x55; 24]);
        }
        let at = Layout {
            stride,
            ..layout(PixelFormat::Yuyv, w, h)
        };
        let a = yuyv_to_jpeg(&tight, &layout(PixelFormat::Yuyv, w, h), 80).unwrap();
        let b = yuyv_to_jpeg(&padded, &at, 80).unwrap();
        assert_eq!(a, b, "the padding is not part of the picture");
    }

    #[test]
    fn mjpeg_passes_through_byte_for_byte_without_trailing_padding() {
        let jpeg = encode_rgb(&bands(64, 48), 64, 48, 80).unwrap();
        let same = to_jpeg(
            raw(jpeg.clone()),
            &layout(PixelFormat::Mjpeg, 64, 48),
            80,
            1 << 20,
        )
        .unwrap();
        assert_eq!(&same.jpeg[..], &jpeg[..]);
        assert_eq!((same.width, same.height), (64, 48));
        // A driver that reports its whole buffer as used.
        let mut padded = jpeg.clone();
        padded.resize(jpeg.len() + 100_000, 0);
        let trimmed = mjpeg(padded, 1 << 20).unwrap();
        assert_eq!(&trimmed.jpeg[..], &jpeg[..]);
    }

    #[test]
    fn bad_frames_are_refused_with_their_reason() {
        let mjpeg_layout = layout(PixelFormat::Mjpeg, 64, 48);
        let why =
            |data: Vec<u8>, layout: &Layout, max| to_jpeg(raw(data), layout, 80, max).unwrap_err();
        let jpeg = encode_rgb(&bands(64, 48), 64, 48, 80).unwrap();
        assert_eq!(
            why(Vec::new(), &mjpeg_layout, 1 << 20).why,
            Rejection::Truncated
        );
        assert_eq!(
            why(vec![0; 4096], &mjpeg_layout, 1 << 20).why,
            Rejection::Truncated
        );
        assert_eq!(
            why(b"not a picture at all".to_vec(), &mjpeg_layout, 1 << 20).why,
            Rejection::Garbage
        );
        let cut = jpeg[..jpeg.len() / 2].to_vec();
        assert_eq!(why(cut, &mjpeg_layout, 1 << 20).why, Rejection::Truncated);
        assert_eq!(
            why(jpeg.clone(), &mjpeg_layout, 100).why,
            Rejection::Oversized
        );
        let damaged = to_jpeg(
            RawFrame {
                data: jpeg,
                damaged: true,
            },
            &mjpeg_layout,
            80,
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(damaged.why, Rejection::Garbage);
        assert!(damaged.message.contains("damaged"), "{}", damaged.message);

        let yuyv_layout = layout(PixelFormat::Yuyv, 64, 48);
        let short = why(vec![128; 64 * 2 * 47], &yuyv_layout, 1 << 20);
        assert_eq!(short.why, Rejection::Truncated);
        assert!(short.message.contains("needs 6144"), "{}", short.message);
        let odd = why(
            vec![128; 63 * 2 * 48],
            &layout(PixelFormat::Yuyv, 63, 48),
            1 << 20,
        );
        assert_eq!(odd.why, Rejection::Garbage);
        let big = why(yuyv_from_rgb(&bands(64, 48), 64, 48), &yuyv_layout, 200);
        assert_eq!(big.why, Rejection::Oversized);
        // A driver's stride so large the rows' size does not fit a usize.
        let bogus = Layout {
            stride: usize::MAX / 2,
            ..yuyv_layout
        };
        let stride = why(vec![128; 64 * 2 * 48], &bogus, 1 << 20);
        assert_eq!(stride.why, Rejection::Garbage);
        assert!(stride.message.contains("stride"), "{}", stride.message);
    }
}
