//! The typed reading of one tegrastats line, borrowed from the line.
//!
//! Invariants:
//! - A [`Sample`] owns fixed-capacity storage only (capacities are the `MAX_*` constants); building
//!   and reading one never touches the heap. Items past a capacity are counted in
//!   [`Sample::overflow`], never silently lost (the derived [`Sample::gpu`] summary keeps its first
//!   [`MAX_CLOCKS`] clocks; [`Sample::gpu_fields`] keeps them all).
//! - Every name and unknown token is a sub-slice of the parsed line.
//! - Lists keep line order (CPU cores keep their index); duplicates are kept.
//! - A value tegrastats did not print is `None`, never `0`: "no utilisation printed" and "0 %" differ.

use core::fmt;
use core::ops::Deref;

/// Most CPU cores kept per line (Thor prints 14).
pub const MAX_CPUS: usize = 32;
/// Most GPU fields (`GR3D_FREQ`, `GR3D2_FREQ`, `GR3D_PCI`, ...) kept per line.
pub const MAX_GPU_FIELDS: usize = 4;
/// Most clocks in one field's `@[F,F,...]` array (Thor prints 3); a longer array is an unknown token.
pub const MAX_CLOCKS: usize = 8;
/// Most engines (`NVENC`, `VIC`, `NVDLA0`, ...) kept per line (JetPack 6/7 print 9).
pub const MAX_ENGINES: usize = 32;
/// Most temperatures kept per line (the largest observed zone set has 11).
pub const MAX_TEMPERATURES: usize = 32;
/// Most power rails kept per line (the largest observed rail set has 6).
pub const MAX_RAILS: usize = 32;
/// Most unknown tokens kept per line.
pub const MAX_UNKNOWN: usize = 32;

/// The wall-clock prefix `MM-DD-YYYY HH:MM:SS` printed by JetPack 5 and later.
///
/// Local time without a time zone, whole seconds; boards without an RTC print wrong dates, and
/// several lines may share one stamp. `Display` prints it back in the tegrastats form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Year, four digits.
    pub year: u16,
    /// Month, 1 to 12.
    pub month: u8,
    /// Day of the month, 1 to 31.
    pub day: u8,
    /// Hour, 0 to 23.
    pub hour: u8,
    /// Minute, 0 to 59.
    pub minute: u8,
    /// Second, 0 to 60 (a leap second is accepted).
    pub second: u8,
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}-{:02}-{:04} {:02}:{:02}:{:02}",
            self.month, self.day, self.year, self.hour, self.minute, self.second
        )
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// `RAM used/totalMB (lfb NxSIZE)`: memory as Linux accounts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Ram {
    /// Memory in use, MiB (a value printed in kB is rounded down to MiB).
    pub used_mb: u32,
    /// Memory Linux sees, MiB.
    pub total_mb: u32,
    /// Largest free block, when printed.
    pub lfb: Option<Lfb>,
}

/// `(lfb NxSIZE)`: N free blocks of the largest free size (at most 4 MB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Lfb {
    /// Number of free blocks of that size.
    pub blocks: u32,
    /// Size of one block, KiB (`4MB` is 4096, `512kB` is 512).
    pub block_kb: u32,
}

/// `SWAP used/totalMB (cached NMB)`: present only while a swap device is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Swap {
    /// Swap in use, MiB.
    pub used_mb: u32,
    /// Swap size, MiB.
    pub total_mb: u32,
    /// Swapped memory also cached in RAM, MiB, when printed.
    pub cached_mb: Option<u32>,
}

/// `IRAM used/totalkB(lfb NkB)`: memory local to the video engines (TX1 and Nano, as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Iram {
    /// IRAM in use, KiB.
    pub used_kb: u32,
    /// IRAM size, KiB.
    pub total_kb: u32,
    /// Largest free block, KiB, when printed.
    pub lfb_kb: Option<u32>,
}

/// One CPU core of the `CPU [...]` block, at its index in the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Cpu {
    /// False for `off` (core powered down or unplugged) and for an empty entry of the old
    /// `CPU [X%,Y%, , ]@F` form; load and frequency are then `None`.
    pub online: bool,
    /// Load in percent of the current clock, when printed.
    pub load_pct: Option<u32>,
    /// Clock in MHz: the core's own (`X%@F`) or, in the old `cpu [X%,...]@F` form, the shared one.
    pub freq_mhz: Option<u32>,
}

/// The clocks of one field, in MHz: one value for `@F`, one per GPC for `@[F,F,...]`, none when
/// the field printed no clock.
///
/// Dereferences to `&[u32]`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Clocks {
    len: u8,
    mhz: [u32; MAX_CLOCKS],
}

impl Clocks {
    /// The clocks as a slice.
    pub fn as_slice(&self) -> &[u32] {
        &self.mhz[..usize::from(self.len)]
    }

    /// Appends a clock; hands it back when [`MAX_CLOCKS`] are already held.
    pub(crate) fn push(&mut self, mhz: u32) -> Result<(), u32> {
        let slot = self.mhz.get_mut(usize::from(self.len)).ok_or(mhz)?;
        *slot = mhz;
        self.len += 1;
        Ok(())
    }
}

impl Deref for Clocks {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        self.as_slice()
    }
}

impl fmt::Debug for Clocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl<'a> IntoIterator for &'a Clocks {
    type Item = &'a u32;
    type IntoIter = core::slice::Iter<'a, u32>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Clocks {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.as_slice())
    }
}

/// A `[X%][@F | @[F,...]]` reading: utilisation relative to the current clock, and the clock(s).
///
/// Used for `EMC`/`EMC_FREQ` and for the GPU summary ([`Sample::gpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Utilisation {
    /// Busy percentage relative to the current clock; `None` when not printed (Thor's
    /// `GR3D_FREQ @[...]`, DRIVE's `EMC_FREQ @F`), which is not the same as 0.
    pub load_pct: Option<u32>,
    /// Clocks in MHz, possibly none (non-root `GR3D_FREQ X%`).
    pub freq_mhz: Clocks,
}

/// One GPU field as printed: `GR3D`, `GR3D_FREQ`, `GR3D2_FREQ` (second GPC on JetPack 5 Orin), or
/// `GR3D_PCI` (a discrete GPU on old DRIVE boards).
///
/// `N` is the name type: `&str` borrowed from the line in a [`Sample`], `String` when owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GpuField<N> {
    /// The key, e.g. `GR3D_FREQ`.
    pub name: N,
    /// Utilisation percentage (aggregated over GPCs for the array form), when printed.
    pub load_pct: Option<u32>,
    /// The field's clocks, one per GPC in the array form.
    pub freq_mhz: Clocks,
}

/// A hardware engine (video codecs, JPEG, VIC, OFA, DLA, PVA, AVP, ...): an open set of names.
///
/// Forms: `NAME off`, `NAME X%@F`, `NAME @F`, `NAME X%` (DRIVE `*_LOAD`), `NAME F` (MHz only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Engine<N> {
    /// The key as printed, e.g. `NVENC0`, `VIC_FREQ`, `NVDLA0_LOAD`.
    pub name: N,
    /// False when printed `off` (engine not clocked); load and clock are then `None`.
    pub active: bool,
    /// Busy percentage relative to the clock, when printed.
    pub load_pct: Option<u32>,
    /// Clock in MHz, when printed.
    pub freq_mhz: Option<u32>,
}

/// `MTS fg X% bg Y%`: Denver/Carmel MTS foreground and background time (TX2, Xavier, as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Mts {
    /// Foreground percentage.
    pub fg_pct: u32,
    /// Background percentage.
    pub bg_pct: u32,
}

/// A thermal zone reading `ZONE@VALUEC` or, from JetPack 7.2, `ZONE@VALUEC/MAXC`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Temperature<N> {
    /// Zone name as printed (case varies by release: `CPU` up to JetPack 5, `cpu` from 6).
    pub zone: N,
    /// Degrees Celsius; `None` for the `-256C` sentinel (zone unreadable, its power domain off).
    pub celsius: Option<f32>,
    /// Highest value since tegrastats started (JetPack 7.2 `/MAXC`), when printed and readable.
    pub max_celsius: Option<f32>,
}

/// A power rail `NAME cur/avg`, `NAME curmW/avgmW` or `NAME curmW/avgmW/maxmW`.
///
/// The same name may appear twice on a line (`NC` on AGX Orin); both are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Rail<N> {
    /// Rail name as printed, e.g. `VDD_IN`, `POM_5V_GPU`, `CPU`.
    pub name: N,
    /// Instantaneous power, mW.
    pub current_mw: u32,
    /// Mean since tegrastats started, mW; `None` for a lone `NAME curmW`. On the first line of a
    /// run it can be meaningless (`VIN 87426mW/43713mW`).
    pub average_mw: Option<u32>,
    /// Maximum since tegrastats started, mW (JetPack 7.2), when printed.
    pub max_mw: Option<u32>,
}

/// The typed reading of one tegrastats line, borrowing names from the line.
///
/// Built by [`crate::parse_line`]; every family is optional. Lists are in line order.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub(crate) timestamp: Option<Timestamp>,
    pub(crate) ram: Option<Ram>,
    pub(crate) swap: Option<Swap>,
    pub(crate) iram: Option<Iram>,
    pub(crate) cpus: heapless::Vec<Cpu, MAX_CPUS>,
    pub(crate) emc: Option<Utilisation>,
    pub(crate) gpu_fields: heapless::Vec<GpuField<&'a str>, MAX_GPU_FIELDS>,
    pub(crate) engines: heapless::Vec<Engine<&'a str>, MAX_ENGINES>,
    pub(crate) ape_mhz: Option<u32>,
    pub(crate) mts: Option<Mts>,
    pub(crate) edp_limit_mhz: Option<u32>,
    pub(crate) temperatures: heapless::Vec<Temperature<&'a str>, MAX_TEMPERATURES>,
    pub(crate) rails: heapless::Vec<Rail<&'a str>, MAX_RAILS>,
    pub(crate) unknown: heapless::Vec<&'a str, MAX_UNKNOWN>,
    pub(crate) overflow: u32,
}

impl<'a> Sample<'a> {
    pub(crate) const fn empty() -> Self {
        Sample {
            timestamp: None,
            ram: None,
            swap: None,
            iram: None,
            cpus: heapless::Vec::new(),
            emc: None,
            gpu_fields: heapless::Vec::new(),
            engines: heapless::Vec::new(),
            ape_mhz: None,
            mts: None,
            edp_limit_mhz: None,
            temperatures: heapless::Vec::new(),
            rails: heapless::Vec::new(),
            unknown: heapless::Vec::new(),
            overflow: 0,
        }
    }

    /// The `MM-DD-YYYY HH:MM:SS` prefix (JetPack 5 and later).
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.timestamp
    }

    /// The `RAM` field.
    pub fn ram(&self) -> Option<Ram> {
        self.ram
    }

    /// The `SWAP` field (absent while no swap device is active).
    pub fn swap(&self) -> Option<Swap> {
        self.swap
    }

    /// The `IRAM` field (TX1 and Nano, as root).
    pub fn iram(&self) -> Option<Iram> {
        self.iram
    }

    /// The CPU cores in index order, `off` cores included; empty when the line has no CPU block.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// The memory controller (`EMC_FREQ` or, old format, `EMC`).
    pub fn emc(&self) -> Option<Utilisation> {
        self.emc
    }

    /// The GPU fields as printed, in line order.
    pub fn gpu_fields(&self) -> &[GpuField<&'a str>] {
        &self.gpu_fields
    }

    /// The integrated GPU in one reading, `None` when the line has no `GR3D*` field other than
    /// `GR3D_PCI`.
    ///
    /// The utilisation is that of the first such field: aggregated over GPCs in the
    /// `GR3D_FREQ X%@[F,F]` form, GPC 0 in the JetPack 5 `GR3D_FREQ`/`GR3D2_FREQ` pair, `None` on
    /// Thor (`@[F,F,F]`) where tegrastats prints none. The clocks are those of all such fields in
    /// line order (at most [`MAX_CLOCKS`]).
    pub fn gpu(&self) -> Option<Utilisation> {
        gpu_summary(&self.gpu_fields)
    }

    /// The engines, in line order.
    pub fn engines(&self) -> &[Engine<&'a str>] {
        &self.engines
    }

    /// The audio processing engine clock (`APE F`), MHz.
    pub fn ape_mhz(&self) -> Option<u32> {
        self.ape_mhz
    }

    /// The `MTS fg X% bg Y%` field.
    pub fn mts(&self) -> Option<Mts> {
        self.mts
    }

    /// The `EDP limit F` field of the old format, MHz (0 when no limit applies).
    pub fn edp_limit_mhz(&self) -> Option<u32> {
        self.edp_limit_mhz
    }

    /// The temperatures, in line (sensor enumeration) order.
    pub fn temperatures(&self) -> &[Temperature<&'a str>] {
        &self.temperatures
    }

    /// The power rails, in line order, duplicates kept.
    pub fn rails(&self) -> &[Rail<&'a str>] {
        &self.rails
    }

    /// Tokens that are no known field, verbatim, in line order. A field repeated on one line
    /// (a second `RAM ...`) is kept here whole.
    pub fn unknown(&self) -> &[&'a str] {
        &self.unknown
    }

    /// How many items (CPU cores, GPU fields, engines, temperatures, rails, unknown tokens) were
    /// dropped because their list was at its `MAX_*` capacity. 0 on every real line.
    pub fn overflow(&self) -> u32 {
        self.overflow
    }
}

/// The rule of [`Sample::gpu`], shared with the owned form.
pub(crate) fn gpu_summary<N: AsRef<str>>(fields: &[GpuField<N>]) -> Option<Utilisation> {
    let mut integrated = fields.iter().filter(|f| f.name.as_ref() != "GR3D_PCI");
    let first = integrated.next()?;
    let mut summary = Utilisation {
        load_pct: first.load_pct,
        freq_mhz: first.freq_mhz,
    };
    for field in integrated {
        for &mhz in field.freq_mhz.iter() {
            // A full summary keeps its first MAX_CLOCKS clocks; the fields keep them all.
            let _ = summary.freq_mhz.push(mhz);
        }
    }
    Some(summary)
}
