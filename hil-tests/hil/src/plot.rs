//! The report's chart: wake-up latency distributions as complementary CDFs (fraction of cycles
//! later than x, log scale), one line per arm, drawn into an RGB raster and encoded as PNG.
//!
//! Text uses a built-in 5×7 bitmap font (upper case, digits, a few signs), so the chart needs no
//! font file and no system font library (fontconfig, freetype).
//!
//! Invariants:
//! - Pure: pixels in, PNG bytes out; no file or clock.
//! - Characters outside the font are drawn as a box, never dropped silently.

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Blue for the agent-off arm.
pub const BLUE: Rgb = [31, 119, 180];
/// Orange for the agent-on arm.
pub const ORANGE: Rgb = [255, 127, 14];
/// Green for a third series.
pub const GREEN: Rgb = [44, 160, 44];
const BLACK: Rgb = [0, 0, 0];
const GREY: Rgb = [200, 200, 200];
const WHITE: Rgb = [255, 255, 255];

/// A raster.
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            pixels: vec![255; width * height * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, colour: Rgb) {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return;
        }
        let i = (y as usize * self.width + x as usize) * 3;
        self.pixels[i..i + 3].copy_from_slice(&colour);
    }

    /// The colour at (x, y), if inside.
    pub fn get(&self, x: usize, y: usize) -> Option<Rgb> {
        (x < self.width && y < self.height).then(|| {
            let i = (y * self.width + x) * 3;
            [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
        })
    }

    /// Fills a rectangle.
    pub fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, colour: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, colour);
            }
        }
    }

    /// A line `thickness` pixels wide (Bresenham, thickened by squares).
    pub fn line(
        &mut self,
        (x0, y0): (i64, i64),
        (x1, y1): (i64, i64),
        colour: Rgb,
        thickness: i64,
    ) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let half = thickness / 2;
        loop {
            self.rect(x - half, y - half, thickness, thickness, colour);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Draws `text` with its top-left corner at (x, y); `scale` pixels per font pixel.
    pub fn text(&mut self, x: i64, y: i64, text: &str, scale: i64, colour: Rgb) {
        let mut cx = x;
        for ch in text.chars() {
            let rows = glyph(ch.to_ascii_uppercase());
            for (ry, row) in rows.iter().enumerate() {
                for rx in 0..5 {
                    if row & (0x10 >> rx) != 0 {
                        self.rect(cx + rx * scale, y + ry as i64 * scale, scale, scale, colour);
                    }
                }
            }
            cx += 6 * scale;
        }
    }

    /// Width of `text` in pixels at `scale`.
    pub fn text_width(text: &str, scale: i64) -> i64 {
        text.chars().count() as i64 * 6 * scale
    }

    /// PNG bytes.
    pub fn png(&self) -> Result<Vec<u8>, png::EncodingError> {
        let mut out = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut out, self.width as u32, self.height as u32);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder.set_compression(png::Compression::High);
            let mut writer = encoder.write_header()?;
            writer.write_image_data(&self.pixels)?;
        }
        Ok(out)
    }
}

/// 5×7 glyphs, one byte per row, bit 4 leftmost.
fn glyph(ch: char) -> [u8; 7] {
    match ch {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        'A' => [0x0e, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'B' => [0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e],
        'C' => [0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e],
        'D' => [0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c],
        'E' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f],
        'F' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10],
        'G' => [0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f],
        'H' => [0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'I' => [0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f],
        'M' => [0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'P' => [0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10],
        'Q' => [0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d],
        'R' => [0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11],
        'S' => [0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e],
        'T' => [0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a],
        'X' => [0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0a, 0x04, 0x04, 0x04],
        'Z' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f],
        'µ' => [0x00, 0x11, 0x11, 0x11, 0x13, 0x1d, 0x10],
        ' ' => [0; 7],
        '.' => [0, 0, 0, 0, 0, 0x0c, 0x0c],
        ',' => [0, 0, 0, 0, 0x0c, 0x04, 0x08],
        ':' => [0, 0x0c, 0x0c, 0, 0x0c, 0x0c, 0],
        '-' => [0, 0, 0, 0x1f, 0, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1f, 0x04, 0x04, 0],
        '=' => [0, 0, 0x1f, 0, 0x1f, 0, 0],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '<' => [0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02],
        '>' => [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08],
        '_' => [0, 0, 0, 0, 0, 0, 0x1f],
        '\'' => [0x04, 0x04, 0x08, 0, 0, 0, 0],
        // Unknown: a box.
        _ => [0x1f, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1f],
    }
}

/// One distribution to draw.
pub struct Series<'a> {
    /// Legend text.
    pub label: String,
    /// Latencies in ns, sorted ascending.
    pub sorted_ns: &'a [u64],
    /// Line colour.
    pub colour: Rgb,
}

/// A "nice" tick step (1, 2 or 5 × 10ⁿ) giving about `ticks` ticks over `span`.
pub fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let residual = raw / magnitude;
    let nice = if residual <= 1.0 {
        1.0
    } else if residual <= 2.0 {
        2.0
    } else if residual <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// Complementary CDFs of the series, x in µs up to `x_max_us`, y from 1 down to `y_min`
/// (a power of ten below 1) on a log scale.
pub fn ccdf_chart(title: &str, series: &[Series<'_>], x_max_us: f64, y_min: f64) -> Canvas {
    let (width, height) = (960usize, 600usize);
    let mut c = Canvas::new(width, height);
    let (left, right, top, bottom) = (100i64, 30i64, 60i64, 90i64);
    let (pw, ph) = (width as i64 - left - right, height as i64 - top - bottom);
    c.text(left, 20, title, 2, BLACK);
    let decades = (-y_min.log10()).max(1.0);
    let y_of = |fraction: f64| top + ((-fraction.log10() / decades) * ph as f64).round() as i64;
    let x_of = |us: f64| left + ((us / x_max_us) * pw as f64).round() as i64;
    // Grid and ticks.
    let step = nice_step(x_max_us, 8.0);
    let mut tick = 0.0;
    while tick <= x_max_us + 1e-9 {
        let x = x_of(tick);
        c.line((x, top), (x, top + ph), GREY, 1);
        let label = format!("{tick}");
        c.text(
            x - Canvas::text_width(&label, 2) / 2,
            top + ph + 10,
            &label,
            2,
            BLACK,
        );
        tick += step;
    }
    for d in 0..=(decades as i64) {
        let fraction = 10f64.powi(-(d as i32));
        let y = y_of(fraction);
        c.line((left, y), (left + pw, y), GREY, 1);
        let label = match d {
            0 => "1".to_owned(),
            1 => "0.1".to_owned(),
            2 => "0.01".to_owned(),
            _ => format!("1E-{d}"),
        };
        c.text(
            left - 10 - Canvas::text_width(&label, 2),
            y - 7,
            &label,
            2,
            BLACK,
        );
    }
    c.line((left, top), (left, top + ph), BLACK, 2);
    c.line((left, top + ph), (left + pw, top + ph), BLACK, 2);
    let x_title = "WAKE-UP LATENCY (µS)";
    c.text(
        left + pw / 2 - Canvas::text_width(x_title, 2) / 2,
        top + ph + 40,
        x_title,
        2,
        BLACK,
    );
    c.text(8, top - 24, "FRACTION LATER", 2, BLACK);
    // Lines.
    for s in series {
        let n = s.sorted_ns.len();
        if n == 0 {
            continue;
        }
        let mut previous: Option<(i64, i64)> = None;
        for col in 0..=pw {
            let us = col as f64 * x_max_us / pw as f64;
            let ns = (us * 1000.0) as u64;
            let later = n - s.sorted_ns.partition_point(|&l| l <= ns);
            if later == 0 {
                break;
            }
            let fraction = (later as f64 / n as f64).max(y_min);
            let point = (left + col, y_of(fraction));
            if let Some(p) = previous {
                c.line(p, point, s.colour, 3);
            }
            previous = Some(point);
        }
    }
    // Legend.
    for (i, s) in series.iter().enumerate() {
        let y = top + 14 + i as i64 * 26;
        let x = left + pw - 470;
        c.rect(x - 6, y - 6, 476, 26, WHITE);
        c.rect(x, y, 24, 14, s.colour);
        c.text(x + 34, y, &s.label, 2, BLACK);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(100.0, 10.0), 10.0);
        assert_eq!(nice_step(130.0, 8.0), 20.0);
        assert_eq!(nice_step(400.0, 8.0), 50.0);
        assert_eq!(nice_step(7.0, 8.0), 1.0);
    }

    #[test]
    fn a_chart_draws_both_series_in_their_colours_and_encodes_as_png() {
        let off: Vec<u64> = (0..1000).map(|i| 10_000 + i * 20).collect();
        let on: Vec<u64> = (0..1000).map(|i| 15_000 + i * 40).collect();
        let chart = ccdf_chart(
            "TEST",
            &[
                Series {
                    label: "OFF".into(),
                    sorted_ns: &off,
                    colour: BLUE,
                },
                Series {
                    label: "ON".into(),
                    sorted_ns: &on,
                    colour: ORANGE,
                },
            ],
            100.0,
            1e-3,
        );
        let count = |colour: Rgb| {
            (0..960)
                .flat_map(|x| (0..600).map(move |y| (x, y)))
                .filter(|&(x, y)| chart.get(x, y) == Some(colour))
                .count()
        };
        // Each line plus its legend box.
        assert!(count(BLUE) > 24 * 14 + 200, "{}", count(BLUE));
        assert!(count(ORANGE) > 24 * 14 + 200, "{}", count(ORANGE));
        let png = chart.png().unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn unknown_characters_are_drawn_as_boxes() {
        let mut c = Canvas::new(20, 10);
        c.text(0, 0, "~", 1, BLACK);
        assert_eq!(c.get(0, 0), Some(BLACK));
        assert_eq!(c.get(4, 6), Some(BLACK));
        assert_eq!(c.get(2, 3), Some(WHITE));
    }
}
