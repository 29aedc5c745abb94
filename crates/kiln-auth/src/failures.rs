//! Failed attempts per client address, in fixed one-minute windows.
//!
//! Memory is bounded: past [`MAX_ADDRESSES`] tracked addresses, expired windows are
//! dropped, and if that is not enough the table starts over (forgetting is the safe
//! direction: it lets clients try again, it never locks one out).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::AuthError;

const WINDOW: Duration = Duration::from_secs(60);
const MAX_ADDRESSES: usize = 65_536;

pub(crate) struct Failures {
    per_minute: u32,
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Failures {
    pub(crate) fn new(per_minute: u32) -> Self {
        Failures {
            per_minute,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses an address that used up this minute's failures.
    pub(crate) fn admit(&self, client: IpAddr, now: Instant) -> Result<(), AuthError> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match windows.get(&client) {
            Some(&(start, count)) if count >= self.per_minute && now < start + WINDOW => {
                let left = (start + WINDOW).saturating_duration_since(now);
                Err(AuthError::TooManyFailures {
                    retry_after_secs: left.as_secs().max(1),
                })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn record(&self, client: IpAddr, now: Instant) {
        if self.per_minute == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() >= MAX_ADDRESSES && !windows.contains_key(&client) {
            windows.retain(|_, (start, _)| now < *start + WINDOW);
            if windows.len() >= MAX_ADDRESSES {
                windows.clear();
            }
        }
        let window = windows.entry(client).or_insert((now, 0));
        if now >= window.0 + WINDOW {
            *window = (now, 0);
        }
        window.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_comes_back_after_the_window() {
        let failures = Failures::new(2);
        let client = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let t0 = Instant::now();
        failures.record(client, t0);
        assert!(failures.admit(client, t0).is_ok());
        failures.record(client, t0);
        assert!(failures
            .admit(client, t0 + Duration::from_secs(59))
            .is_err());
        assert!(failures.admit(client, t0 + WINDOW).is_ok());
        failures.record(client, t0 + WINDOW);
        assert!(failures.admit(client, t0 + WINDOW).is_ok(), "a new window");
    }
}
