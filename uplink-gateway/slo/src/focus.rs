//! FOCUS export of a [`CostReport`]: one Usage row per (machine, UTC day, model version,
//! component), corrections for closed days that late data changed, CSV in and out, and the
//! companion table of autonomous hours.
//!
//! Column choices (FOCUS names first, then `x_` custom columns, as FOCUS requires):
//! - `EffectiveCost` is the amortized cost. `BilledCost` is 0 on `edge-compute-amortization` rows
//!   (the computer was billed when it was bought) and equals `EffectiveCost` elsewhere.
//!   `ListCost` and `ContractedCost` equal `EffectiveCost`: the price book has no discounts.
//! - `ConsumedQuantity`/`PricingQuantity`: machine hours (`Hours`) for amortization, kWh for
//!   energy; empty for the allocated cloud shares, whose basis `x_AllocationMethod` names.
//! - `ResourceId`/`ResourceName` = `machine_id`; `Tags` = JSON of class, site, model, version.
//! - The denominator (autonomous hours) is never a cost-row column: summing it over the four
//!   component rows of a cell would count it four times. It is the companion table
//!   ([`write_autonomy_csv`]); the KPI is Σ `EffectiveCost` / Σ `x_AutonomousMachineHours`.
//!
//! Restatement: a charge period (UTC day) is *closed* once a previous export holds any row for
//! it. For a closed day [`focus_rows`] emits no regular row again; where the current cost or
//! quantity of a row key differs from the sum of everything exported for it before (regular rows
//! and earlier corrections), it emits a `ChargeClass=Correction` row carrying the difference, with
//! the original charge period and the billing period of the export time.
//!
//! Invariants:
//! - Previous rows + new rows sum, per key, to the current report (within [`CORRECTION_EPSILON`]).
//! - Exporting twice from the same data emits nothing the second time.
//! - [`write_focus_csv`] and [`parse_focus_csv`] round-trip every row exactly (amounts and
//!   quantities are rounded to nine decimals when rows are made).

use crate::calendar::{MS_PER_DAY, format_rfc3339, month_bounds, parse_rfc3339};
use crate::cost::{AMORTIZATION_SERVICE, CostLine, CostReport, ENERGY_SERVICE};
use crate::names::label;
use std::collections::{BTreeMap, BTreeSet};

/// Differences smaller than this (in currency units or quantity units) are rounding, not a
/// restatement: amounts are written with nine decimals.
pub const CORRECTION_EPSILON: f64 = 1e-6;

/// FOCUS columns, in the order written, then the custom ones.
pub const FOCUS_COLUMNS: [&str; 28] = [
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingQuantity",
    "PricingUnit",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceName",
    "ServiceCategory",
    "Tags",
    "x_MachineId",
    "x_Site",
    "x_MachineClass",
    "x_Model",
    "x_ModelVersion",
    "x_AllocationMethod",
];

/// Columns of the companion table of autonomous hours.
pub const AUTONOMY_COLUMNS: [&str; 8] = [
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "x_MachineId",
    "x_Site",
    "x_MachineClass",
    "x_Model",
    "x_ModelVersion",
    "x_AutonomousMachineHours",
];

/// One FOCUS cost row.
#[derive(Debug, Clone, PartialEq)]
pub struct FocusRow {
    /// `BilledCost`.
    pub billed_cost: f64,
    /// `EffectiveCost`.
    pub effective_cost: f64,
    /// `ListCost`.
    pub list_cost: f64,
    /// `ContractedCost`.
    pub contracted_cost: f64,
    /// `BillingCurrency`.
    pub billing_currency: String,
    /// `BillingPeriodStart`, Unix ms.
    pub billing_period_start_ms: i64,
    /// `BillingPeriodEnd` (exclusive), Unix ms.
    pub billing_period_end_ms: i64,
    /// `ChargePeriodStart`, Unix ms.
    pub charge_period_start_ms: i64,
    /// `ChargePeriodEnd` (exclusive), Unix ms.
    pub charge_period_end_ms: i64,
    /// `ChargeCategory` (always `Usage` here).
    pub charge_category: String,
    /// `ChargeClass` is `Correction` (true) or empty (false).
    pub correction: bool,
    /// `ChargeDescription`.
    pub charge_description: String,
    /// `ConsumedQuantity`.
    pub consumed_quantity: Option<f64>,
    /// `ConsumedUnit`.
    pub consumed_unit: String,
    /// `PricingQuantity`.
    pub pricing_quantity: Option<f64>,
    /// `PricingUnit`.
    pub pricing_unit: String,
    /// `ResourceId`.
    pub resource_id: String,
    /// `ResourceName`.
    pub resource_name: String,
    /// `ResourceType`.
    pub resource_type: String,
    /// `ServiceName`.
    pub service_name: String,
    /// `ServiceCategory`.
    pub service_category: String,
    /// `Tags`, written as a JSON object.
    pub tags: BTreeMap<String, String>,
    /// `x_MachineId`.
    pub machine_id: String,
    /// `x_Site`.
    pub site: String,
    /// `x_MachineClass`.
    pub machine_class: String,
    /// `x_Model`.
    pub model: String,
    /// `x_ModelVersion`.
    pub model_version: String,
    /// `x_AllocationMethod`.
    pub allocation_method: String,
}

/// Identity of a row across exports: what a correction restates.
type RowKey = (i64, String, String, String, String, String, String);

impl FocusRow {
    fn key(&self) -> RowKey {
        (
            self.charge_period_start_ms,
            self.resource_id.clone(),
            self.service_name.clone(),
            self.site.clone(),
            self.machine_class.clone(),
            self.model.clone(),
            self.model_version.clone(),
        )
    }
}

/// A FOCUS or companion CSV that cannot be read back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FocusError {
    /// The header lacks a column.
    #[error("the CSV header has no `{0}` column")]
    MissingColumn(&'static str),
    /// A record has a different number of fields than the header.
    #[error("line {line}: {found} fields where the header has {expected}")]
    FieldCount {
        /// 1-based line of the record.
        line: usize,
        /// Fields found.
        found: usize,
        /// Fields in the header.
        expected: usize,
    },
    /// A quoted field is not closed.
    #[error("line {0}: unterminated quoted field")]
    UnterminatedQuote(usize),
    /// A field does not hold what its column needs.
    #[error("line {line}: `{value}` is not a valid {column}")]
    BadValue {
        /// 1-based line of the record.
        line: usize,
        /// The column.
        column: &'static str,
        /// The text found.
        value: String,
    },
}

struct Component {
    service_name: &'static str,
    service_category: &'static str,
    billed: bool,
    cost: f64,
    quantity: Option<f64>,
    unit: &'static str,
    allocation_method: &'static str,
    description: String,
}

fn components(line: &CostLine, currency: &str) -> Vec<Component> {
    let k = &line.key;
    let mut out = Vec::with_capacity(4);
    if line.machine_hours > 0.0 {
        out.push(Component {
            service_name: AMORTIZATION_SERVICE,
            service_category: "Compute",
            billed: false,
            cost: line.amortization,
            quantity: Some(line.machine_hours),
            unit: "Hours",
            allocation_method: "machine-hours",
            description: match line.hourly_rate {
                Some(rate) => format!(
                    "Edge computer amortization at {} {currency} per machine hour",
                    decimal(rate)
                ),
                None => format!(
                    "Edge computer amortization: no price for class {}",
                    k.machine_class
                ),
            },
        });
    }
    if line.energy_kwh > 0.0 {
        out.push(Component {
            service_name: ENERGY_SERVICE,
            service_category: "Other",
            billed: true,
            cost: line.energy,
            quantity: Some(line.energy_kwh),
            unit: "kWh",
            allocation_method: "measured",
            description: match line.energy_price_per_kwh {
                Some(p) => format!(
                    "Edge energy from the power rails at {} {currency}/kWh",
                    decimal(p)
                ),
                None => format!(
                    "Edge energy from the power rails: no tariff for site {}",
                    k.site
                ),
            },
        });
    }
    for (name, cost) in [
        ("cloud-inference", line.cloud_inference),
        ("training", line.training),
    ] {
        if cost != 0.0 {
            out.push(Component {
                service_name: name,
                service_category: "AI and Machine Learning",
                billed: true,
                cost,
                quantity: None,
                unit: "",
                allocation_method: "autonomous-hours-share",
                description: format!(
                    "Share of {name} by autonomous hours ({} h this day)",
                    decimal(line.autonomous_hours)
                ),
            });
        }
    }
    out
}

/// The regular (non-correction) rows of a report.
fn regular_rows(report: &CostReport) -> Vec<FocusRow> {
    let mut rows = Vec::new();
    for line in &report.lines {
        let k = &line.key;
        let (billing_start, billing_end) = month_bounds(k.day_start_ms);
        let tags = BTreeMap::from([
            (label::MACHINE_CLASS.to_owned(), k.machine_class.clone()),
            (label::MODEL.to_owned(), k.model.clone()),
            (label::MODEL_VERSION.to_owned(), k.model_version.clone()),
            (label::SITE.to_owned(), k.site.clone()),
        ]);
        for c in components(line, &report.currency) {
            let cost = round9(c.cost);
            let quantity = c.quantity.map(round9);
            rows.push(FocusRow {
                billed_cost: if c.billed { cost } else { 0.0 },
                effective_cost: cost,
                list_cost: cost,
                contracted_cost: cost,
                billing_currency: report.currency.clone(),
                billing_period_start_ms: billing_start,
                billing_period_end_ms: billing_end,
                charge_period_start_ms: k.day_start_ms,
                charge_period_end_ms: k.day_start_ms + MS_PER_DAY,
                charge_category: "Usage".to_owned(),
                correction: false,
                charge_description: c.description,
                consumed_quantity: quantity,
                consumed_unit: c.unit.to_owned(),
                pricing_quantity: quantity,
                pricing_unit: c.unit.to_owned(),
                resource_id: k.machine_id.clone(),
                resource_name: k.machine_id.clone(),
                resource_type: "Autonomous machine".to_owned(),
                service_name: c.service_name.to_owned(),
                service_category: c.service_category.to_owned(),
                tags: tags.clone(),
                machine_id: k.machine_id.clone(),
                site: k.site.clone(),
                machine_class: k.machine_class.clone(),
                model: k.model.clone(),
                model_version: k.model_version.clone(),
                allocation_method: c.allocation_method.to_owned(),
            });
        }
    }
    rows
}

/// Sums of what has been exported for one key.
#[derive(Default, Clone, Copy)]
struct Exported {
    billed: f64,
    effective: f64,
    list: f64,
    contracted: f64,
    consumed: f64,
    pricing: f64,
}

impl Exported {
    fn add(&mut self, r: &FocusRow) {
        self.billed += r.billed_cost;
        self.effective += r.effective_cost;
        self.list += r.list_cost;
        self.contracted += r.contracted_cost;
        self.consumed += r.consumed_quantity.unwrap_or(0.0);
        self.pricing += r.pricing_quantity.unwrap_or(0.0);
    }
}

/// The rows to append to an export that already holds `previous`: regular rows for days not yet
/// exported, and `Correction` rows for exported days whose numbers changed (see the module doc).
/// `now_ms` only sets the billing period of corrections.
pub fn focus_rows(report: &CostReport, previous: &[FocusRow], now_ms: i64) -> Vec<FocusRow> {
    let closed: BTreeSet<i64> = previous.iter().map(|r| r.charge_period_start_ms).collect();
    let mut exported: BTreeMap<RowKey, (Exported, &FocusRow)> = BTreeMap::new();
    for r in previous {
        exported
            .entry(r.key())
            .or_insert((Exported::default(), r))
            .0
            .add(r);
    }
    let (billing_start, billing_end) = month_bounds(now_ms);
    let correction = |mut row: FocusRow, before: Exported| -> Option<FocusRow> {
        let d = |now: f64, then: f64| round9(now - then);
        let delta_cost = d(row.effective_cost, before.effective);
        let delta_qty = d(row.consumed_quantity.unwrap_or(0.0), before.consumed);
        if delta_cost.abs() < CORRECTION_EPSILON && delta_qty.abs() < CORRECTION_EPSILON {
            return None;
        }
        row.billed_cost = d(row.billed_cost, before.billed);
        row.effective_cost = delta_cost;
        row.list_cost = d(row.list_cost, before.list);
        row.contracted_cost = d(row.contracted_cost, before.contracted);
        let had_quantity = row.consumed_quantity.is_some() || before.consumed != 0.0;
        row.consumed_quantity = had_quantity.then_some(delta_qty);
        row.pricing_quantity =
            had_quantity.then(|| d(row.pricing_quantity.unwrap_or(0.0), before.pricing));
        row.correction = true;
        row.charge_description = format!(
            "Correction of {} after late data: {}",
            format_rfc3339(row.charge_period_start_ms),
            row.charge_description
        );
        row.billing_period_start_ms = billing_start;
        row.billing_period_end_ms = billing_end;
        Some(row)
    };

    let mut out = Vec::new();
    for row in regular_rows(report) {
        if !closed.contains(&row.charge_period_start_ms) {
            out.push(row);
            continue;
        }
        let before = exported
            .remove(&row.key())
            .map_or_else(Exported::default, |(e, _)| e);
        out.extend(correction(row, before));
    }
    // Keys exported before that the report no longer has (within its period) are restated to 0.
    let period = report.period.start_ms..report.period.end_ms;
    for (key, (before, template)) in exported {
        if !period.contains(&key.0) {
            continue;
        }
        let mut zero = template.clone();
        zero.billed_cost = 0.0;
        zero.effective_cost = 0.0;
        zero.list_cost = 0.0;
        zero.contracted_cost = 0.0;
        zero.consumed_quantity = zero.consumed_quantity.map(|_| 0.0);
        zero.pricing_quantity = zero.pricing_quantity.map(|_| 0.0);
        zero.charge_description = format!("no {} usage remains for this day", zero.service_name);
        out.extend(correction(zero, before));
    }
    out
}

/// Amounts and quantities in rows are rounded to nine decimals, so that the CSV text holds
/// exactly the row's value and a file read back compares equal.
fn round9(v: f64) -> f64 {
    let r = (v * 1e9).round() / 1e9;
    if r == 0.0 { 0.0 } else { r }
}

/// A number as FOCUS decimal text: at most nine decimals, no trailing zeros, no `-0`.
fn decimal(v: f64) -> String {
    let text = format!("{v:.9}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

fn csv_field(out: &mut String, field: &str) {
    if field.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&field.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(field);
    }
}

fn csv_record<'a>(out: &mut String, fields: impl IntoIterator<Item = &'a str>) {
    for (i, f) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        csv_field(out, f);
    }
    out.push_str("\r\n");
}

/// RFC 4180 records (CRLF or LF line ends), with the 1-based line each record starts on.
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, FocusError> {
    let mut records = Vec::new();
    let mut fields = Vec::new();
    let mut field = String::new();
    let (mut line, mut record_line) = (1, 1);
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                _ => {
                    line += usize::from(c == '\n');
                    field.push(c);
                }
            }
            continue;
        }
        match c {
            '"' if at_field_start => {
                quoted = true;
                at_field_start = false;
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                at_field_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                if !(fields.len() == 1 && fields[0].is_empty()) {
                    records.push((record_line, std::mem::take(&mut fields)));
                }
                fields.clear();
                line += 1;
                record_line = line;
                at_field_start = true;
            }
            _ => {
                field.push(c);
                at_field_start = false;
            }
        }
    }
    if quoted {
        return Err(FocusError::UnterminatedQuote(record_line));
    }
    if !field.is_empty() || !fields.is_empty() {
        fields.push(field);
        records.push((record_line, fields));
    }
    Ok(records)
}

/// Writes rows as CSV: the header of [`FOCUS_COLUMNS`], then one record per row.
pub fn write_focus_csv(rows: &[FocusRow]) -> String {
    let mut out = String::new();
    csv_record(&mut out, FOCUS_COLUMNS);
    for r in rows {
        let opt = |v: Option<f64>| v.map(decimal).unwrap_or_default();
        let tags = serde_json::to_string(&r.tags).unwrap_or_else(|_| "{}".to_owned());
        let fields = [
            decimal(r.billed_cost),
            decimal(r.effective_cost),
            decimal(r.list_cost),
            decimal(r.contracted_cost),
            r.billing_currency.clone(),
            format_rfc3339(r.billing_period_start_ms),
            format_rfc3339(r.billing_period_end_ms),
            format_rfc3339(r.charge_period_start_ms),
            format_rfc3339(r.charge_period_end_ms),
            r.charge_category.clone(),
            if r.correction { "Correction" } else { "" }.to_owned(),
            r.charge_description.clone(),
            opt(r.consumed_quantity),
            r.consumed_unit.clone(),
            opt(r.pricing_quantity),
            r.pricing_unit.clone(),
            r.resource_id.clone(),
            r.resource_name.clone(),
            r.resource_type.clone(),
            r.service_name.clone(),
            r.service_category.clone(),
            tags,
            r.machine_id.clone(),
            r.site.clone(),
            r.machine_class.clone(),
            r.model.clone(),
            r.model_version.clone(),
            r.allocation_method.clone(),
        ];
        csv_record(&mut out, fields.iter().map(String::as_str));
    }
    out
}

/// Reads rows written by [`write_focus_csv`] (columns found by name, so extra columns and another
/// order are fine).
pub fn parse_focus_csv(text: &str) -> Result<Vec<FocusRow>, FocusError> {
    let mut records = csv_records(text)?.into_iter();
    let Some((_, header)) = records.next() else {
        return Ok(Vec::new());
    };
    let mut index = [0usize; FOCUS_COLUMNS.len()];
    for (slot, name) in index.iter_mut().zip(FOCUS_COLUMNS) {
        *slot = header
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}') == name)
            .ok_or(FocusError::MissingColumn(name))?;
    }
    let mut rows = Vec::new();
    for (line, fields) in records {
        if fields.len() != header.len() {
            return Err(FocusError::FieldCount {
                line,
                found: fields.len(),
                expected: header.len(),
            });
        }
        let get = |col: usize| fields[index[col]].as_str();
        let bad = |col: usize| FocusError::BadValue {
            line,
            column: FOCUS_COLUMNS[col],
            value: get(col).to_owned(),
        };
        let num = |col: usize| get(col).parse::<f64>().map_err(|_| bad(col));
        let opt_num = |col: usize| match get(col) {
            "" => Ok(None),
            _ => num(col).map(Some),
        };
        let time = |col: usize| parse_rfc3339(get(col)).ok_or_else(|| bad(col));
        let text = |col: usize| get(col).to_owned();
        let correction = match get(10) {
            "" => false,
            "Correction" => true,
            _ => return Err(bad(10)),
        };
        let tags = serde_json::from_str(get(21)).map_err(|_| bad(21))?;
        rows.push(FocusRow {
            billed_cost: num(0)?,
            effective_cost: num(1)?,
            list_cost: num(2)?,
            contracted_cost: num(3)?,
            billing_currency: text(4),
            billing_period_start_ms: time(5)?,
            billing_period_end_ms: time(6)?,
            charge_period_start_ms: time(7)?,
            charge_period_end_ms: time(8)?,
            charge_category: text(9),
            correction,
            charge_description: text(11),
            consumed_quantity: opt_num(12)?,
            consumed_unit: text(13),
            pricing_quantity: opt_num(14)?,
            pricing_unit: text(15),
            resource_id: text(16),
            resource_name: text(17),
            resource_type: text(18),
            service_name: text(19),
            service_category: text(20),
            tags,
            machine_id: text(22),
            site: text(23),
            machine_class: text(24),
            model: text(25),
            model_version: text(26),
            allocation_method: text(27),
        });
    }
    Ok(rows)
}

/// The companion table: autonomous hours per (UTC day, machine, model version) with any usage.
/// It is a denominator, not a bill: rewrite it for a period rather than correct it.
pub fn write_autonomy_csv(report: &CostReport) -> String {
    let mut out = String::new();
    csv_record(&mut out, AUTONOMY_COLUMNS);
    for line in &report.lines {
        let k = &line.key;
        let fields = [
            format_rfc3339(k.day_start_ms),
            format_rfc3339(k.day_start_ms + MS_PER_DAY),
            k.machine_id.clone(),
            k.site.clone(),
            k.machine_class.clone(),
            k.model.clone(),
            k.model_version.clone(),
            decimal(line.autonomous_hours),
        ];
        csv_record(&mut out, fields.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_have_no_trailing_zeros_and_no_negative_zero() {
        assert_eq!(decimal(0.6), "0.6");
        assert_eq!(decimal(20.0), "20");
        assert_eq!(decimal(20.0 / 3.0), "6.666666667");
        assert_eq!(decimal(-1e-12), "0");
        assert_eq!(decimal(-1.5), "-1.5");
    }

    #[test]
    fn csv_fields_with_commas_quotes_and_newlines_round_trip() {
        let mut out = String::new();
        csv_record(&mut out, ["a", "b,c", "say \"hi\"", "two\nlines", ""]);
        csv_record(&mut out, ["1", "2", "3", "4", "5"]);
        let records = csv_records(&out).unwrap();
        assert_eq!(
            records,
            vec![
                (
                    1,
                    vec![
                        "a".into(),
                        "b,c".into(),
                        "say \"hi\"".into(),
                        "two\nlines".into(),
                        String::new()
                    ]
                ),
                (
                    3,
                    vec!["1".into(), "2".into(), "3".into(), "4".into(), "5".into()]
                ),
            ]
        );
        assert_eq!(
            csv_records("a,\"b").unwrap_err(),
            FocusError::UnterminatedQuote(1)
        );
    }

    #[test]
    fn a_csv_without_a_needed_column_is_refused_by_name() {
        let err = parse_focus_csv("BilledCost,EffectiveCost\r\n1,1\r\n").unwrap_err();
        assert_eq!(err, FocusError::MissingColumn("ListCost"));
    }
}
