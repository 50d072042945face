//! The agent's clock.
//!
//! Layout:
//! - [`timerfd`]: a periodic timer on a Linux `timerfd`.

pub mod timerfd;
