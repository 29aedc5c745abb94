//! Failed attempts, counted per client address and per presented name, in fixed one-minute
//! windows.
//!
//! Only guesses count: a request that presents a token (or basic credentials) that is not
//! configured, or a malformed `Authorization` header. A request with no credentials
//! guesses nothing (a browser asks before it sends a token), so it is answered 401 and not
//! counted; and a request with valid credentials is never refused by this limit, whatever
//! others behind the same address or NAT did, since the token is looked up before the
//! limit is consulted. Counting the presented name (the basic-auth user, a tenant id) as
//! well as the address keeps a guesser that spreads over many addresses at the same
//! budget.
//!
//! Memory is bounded: past [`MAX_KEYS`] tracked keys, expired windows are dropped, and if
//! that is not enough the table starts over (forgetting is the safe direction: it lets
//! clients try again, it never locks one out).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::AuthError;

const WINDOW: Duration = Duration::from_secs(60);
const MAX_KEYS: usize = 65_536;

/// What a failure is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Address(IpAddr),
    Name(String),
}

pub(crate) struct Failures {
    per_minute: u32,
    windows: Mutex<HashMap<Key, (Instant, u32)>>,
}

impl Failures {
    pub(crate) fn new(per_minute: u32) -> Self {
        Failures {
            per_minute,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses when any of `keys` used up this minute's failures.
    pub(crate) fn admit(&self, keys: &[Key], now: Instant) -> Result<(), AuthError> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = None;
        for key in keys {
            if let Some(&(start, count)) = windows.get(key) {
                if count >= self.per_minute && now < start + WINDOW {
                    let left = (start + WINDOW).saturating_duration_since(now);
                    wait = wait.max(Some(left.as_secs().max(1)));
                }
            }
        }
        match wait {
            Some(retry_after_secs) => Err(AuthError::TooManyFailures { retry_after_secs }),
            None => Ok(()),
        }
    }

    pub(crate) fn record(&self, keys: &[Key], now: Instant) {
        if self.per_minute == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            if windows.len() >= MAX_KEYS && !windows.contains_key(key) {
                windows.retain(|_, (start, _)| now < *start + WINDOW);
                if windows.len() >= MAX_KEYS {
                    windows.clear();
                }
            }
            let window = windows.entry(key.clone()).or_insert((now, 0));
            if now >= window.0 + WINDOW {
                *window = (now, 0);
            }
            window.1 += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_comes_back_after_the_window() {
        let failures = Failures::new(2);
        let client = [Key::Address(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))];
        let t0 = Instant::now();
        failures.record(&client, t0);
        assert!(failures.admit(&client, t0).is_ok());
        failures.record(&client, t0);
        assert!(failures
            .admit(&client, t0 + Duration::from_secs(59))
            .is_err());
        assert!(failures.admit(&client, t0 + WINDOW).is_ok());
        failures.record(&client, t0 + WINDOW);
        assert!(failures.admit(&client, t0 + WINDOW).is_ok(), "a new window");
    }

    #[test]
    fn a_name_is_counted_across_addresses() {
        let failures = Failures::new(2);
        let t0 = Instant::now();
        let name = Key::Name("team-a".to_string());
        for last in 1..=2u8 {
            let address = Key::Address(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last)));
            failures.record(&[address, name.clone()], t0);
        }
        let fresh = Key::Address(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9)));
        assert!(failures.admit(std::slice::from_ref(&fresh), t0).is_ok());
        assert!(failures.admit(&[fresh, name], t0).is_err());
    }
}
