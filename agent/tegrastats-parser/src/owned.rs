//! [`OwnedSample`]: the same reading with owned names, for code that keeps samples around.
//!
//! Invariants:
//! - An `OwnedSample` holds exactly what the [`Sample`] it came from held, plus the derived
//!   [`Sample::gpu`] summary, so its `Serialize` output is the whole reading (the CLI's JSON).
//! - Building one allocates; the allocation-free path is [`crate::parse_line`].

use core::str::FromStr;

use crate::error::ParseError;
use crate::model::{
    Cpu, Engine, GpuField, Iram, Mts, Rail, Ram, Sample, Swap, Temperature, Timestamp, Utilisation,
    gpu_summary,
};

/// One tegrastats line read into owned data. Field meanings are those of [`Sample`]'s accessors.
///
/// ```
/// use tegrastats_parser::OwnedSample;
///
/// let sample: OwnedSample = "RAM 534/3964MB (lfb 98x4MB) CPU [16%@204,off] VDD_IN 1022/1022".parse()?;
/// assert_eq!(sample.cpus.len(), 2);
/// assert_eq!(sample.rails[0].name, "VDD_IN");
/// # Ok::<(), tegrastats_parser::ParseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OwnedSample {
    /// See [`Sample::timestamp`].
    pub timestamp: Option<Timestamp>,
    /// See [`Sample::ram`].
    pub ram: Option<Ram>,
    /// See [`Sample::swap`].
    pub swap: Option<Swap>,
    /// See [`Sample::iram`].
    pub iram: Option<Iram>,
    /// See [`Sample::cpus`].
    pub cpus: Vec<Cpu>,
    /// See [`Sample::emc`].
    pub emc: Option<Utilisation>,
    /// See [`Sample::gpu`]: derived from `gpu_fields` when converted.
    pub gpu: Option<Utilisation>,
    /// See [`Sample::gpu_fields`].
    pub gpu_fields: Vec<GpuField<String>>,
    /// See [`Sample::engines`].
    pub engines: Vec<Engine<String>>,
    /// See [`Sample::ape_mhz`].
    pub ape_mhz: Option<u32>,
    /// See [`Sample::mts`].
    pub mts: Option<Mts>,
    /// See [`Sample::edp_limit_mhz`].
    pub edp_limit_mhz: Option<u32>,
    /// See [`Sample::temperatures`].
    pub temperatures: Vec<Temperature<String>>,
    /// See [`Sample::rails`].
    pub rails: Vec<Rail<String>>,
    /// See [`Sample::unknown`].
    pub unknown: Vec<String>,
    /// See [`Sample::overflow`].
    pub overflow: u32,
}

impl From<&Sample<'_>> for OwnedSample {
    fn from(sample: &Sample<'_>) -> Self {
        OwnedSample {
            timestamp: sample.timestamp(),
            ram: sample.ram(),
            swap: sample.swap(),
            iram: sample.iram(),
            cpus: sample.cpus().to_vec(),
            emc: sample.emc(),
            gpu: gpu_summary(sample.gpu_fields()),
            gpu_fields: sample
                .gpu_fields()
                .iter()
                .map(|f| GpuField {
                    name: f.name.to_owned(),
                    load_pct: f.load_pct,
                    freq_mhz: f.freq_mhz,
                })
                .collect(),
            engines: sample
                .engines()
                .iter()
                .map(|e| Engine {
                    name: e.name.to_owned(),
                    active: e.active,
                    load_pct: e.load_pct,
                    freq_mhz: e.freq_mhz,
                })
                .collect(),
            ape_mhz: sample.ape_mhz(),
            mts: sample.mts(),
            edp_limit_mhz: sample.edp_limit_mhz(),
            temperatures: sample
                .temperatures()
                .iter()
                .map(|t| Temperature {
                    zone: t.zone.to_owned(),
                    celsius: t.celsius,
                    max_celsius: t.max_celsius,
                })
                .collect(),
            rails: sample
                .rails()
                .iter()
                .map(|r| Rail {
                    name: r.name.to_owned(),
                    current_mw: r.current_mw,
                    average_mw: r.average_mw,
                    max_mw: r.max_mw,
                })
                .collect(),
            unknown: sample.unknown().iter().map(|&u| u.to_owned()).collect(),
            overflow: sample.overflow(),
        }
    }
}

impl From<Sample<'_>> for OwnedSample {
    fn from(sample: Sample<'_>) -> Self {
        OwnedSample::from(&sample)
    }
}

impl FromStr for OwnedSample {
    type Err = ParseError;

    /// Parses with [`crate::parse_line`] and copies the result.
    fn from_str(line: &str) -> Result<Self, ParseError> {
        crate::parse_line(line).map(OwnedSample::from)
    }
}
