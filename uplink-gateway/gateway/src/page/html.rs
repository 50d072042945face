//! HTML output for the fleet page: one escaping function and a writer that only takes static
//! markup raw.
//!
//! Invariants:
//! - Every value reaches the page through [`escape`] (via [`Html::text`]): label values, numbers,
//!   times, URLs. [`Html::raw`] takes `&'static str` only, so markup can come from this crate's
//!   source and nowhere else.
//! - [`escape`] output is safe in element content and in a double- or single-quoted attribute.

/// `value` with `& < > " '` written as character references.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An HTML fragment under construction.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Html(String);

impl Html {
    /// An empty fragment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends markup written in this crate's source.
    pub fn raw(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// Appends a value, escaped.
    pub fn text(&mut self, value: &str) -> &mut Self {
        self.0.push_str(&escape(value));
        self
    }

    /// Appends another fragment (already built by these rules).
    pub fn html(&mut self, other: &Html) -> &mut Self {
        self.0.push_str(&other.0);
        self
    }

    /// The markup.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The markup, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_keeps_plain_text() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(escape("truck-17 ü 99.5%"), "truck-17 ü 99.5%");
        for hostile in ["<img src=x onerror=1>", "\"><svg onload=1>", "'&lt;"] {
            let escaped = escape(hostile);
            assert!(!escaped.contains(['<', '>', '"', '\'']), "{escaped}");
        }
    }

    #[test]
    fn text_escapes_and_raw_does_not() {
        let mut html = Html::new();
        html.raw("<td title=\"")
            .text("a\"b")
            .raw("\">")
            .text("<b>")
            .raw("</td>");
        assert_eq!(html.as_str(), "<td title=\"a&quot;b\">&lt;b&gt;</td>");
    }
}
