//! The key state machine and the pure plan for one change (mqtt.md
//! 'Deciding an event', steps 5 and 6).
//!
//! Nothing here touches SQL: the store reads what the mirror holds into a
//! [`KeyView`] and the tombstone flags, asks for a plan, and carries it out.
//! Step 7 (the invariants) is left to SQLite itself, after the revocations
//! the same event makes, because only the database can see every other key
//! at the moment of the write.

use lockhub_proto::event::{Grant, GrantState, Reason};
use lockhub_proto::time::Timestamp;

/// A key's state in the mirror. `revoked`, `expired` and `used_up` are
/// final; `used_up` (every one of `max_uses` taken) but for a revoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyState {
    PreIssued,
    Active,
    Revoked,
    Expired,
    UsedUp,
}

impl KeyState {
    pub const ALL: [KeyState; 5] = [
        KeyState::PreIssued,
        KeyState::Active,
        KeyState::Revoked,
        KeyState::Expired,
        KeyState::UsedUp,
    ];

    /// The name stored in `keys.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::PreIssued => "pre_issued",
            KeyState::Active => "active",
            KeyState::Revoked => "revoked",
            KeyState::Expired => "expired",
            KeyState::UsedUp => "used_up",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Live keys may still open a door (within their window).
    pub fn is_live(self) -> bool {
        matches!(self, KeyState::PreIssued | KeyState::Active)
    }

    /// Final keys never change again (except that `holder_name` is erased,
    /// and a `used_up` key may be revoked).
    pub fn is_final(self) -> bool {
        !self.is_live()
    }
}

impl From<GrantState> for KeyState {
    fn from(s: GrantState) -> Self {
        match s {
            GrantState::PreIssued => KeyState::PreIssued,
            GrantState::Active => KeyState::Active,
        }
    }
}

/// The transition whitelist: `pre_issued -> active | revoked | expired |
/// used_up`, `active -> revoked | expired | used_up`, `used_up -> revoked`.
/// Staying in the same state is not a transition and is not listed. The
/// schema's `keys_state_whitelist` trigger holds the same list.
pub fn may_move(from: KeyState, to: KeyState) -> bool {
    use KeyState::*;
    matches!(
        (from, to),
        (PreIssued, Active | Revoked | Expired | UsedUp)
            | (Active, Revoked | Expired | UsedUp)
            | (UsedUp, Revoked)
    )
}

/// What the mirror holds for a key id, as far as planning needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyView {
    pub version: u64,
    pub state: KeyState,
}

/// Where a planned grant goes: its window end after the clamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// `min(valid_until, valid_from + max_grant_days)`.
    pub valid_until: Timestamp,
    /// Whether the clamp shortened the window.
    pub clamped: bool,
}

/// The plan for a grant (`key.issued`, or the key of `checkin.completed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantPlan {
    /// A new key row.
    Insert(Placement),
    /// The live key moves to the grant's higher version (doors replaced).
    Upgrade(Placement),
    /// Valid, nothing to change.
    Noop,
    /// Refused at step 5 or 6; `clamped` says whether step 6 saw a clamp.
    Reject { reason: Reason, clamped: bool },
}

/// The clamp of mqtt.md 'Grant': a window never runs past
/// `valid_from + max_grant_days`, whatever the cloud sent.
pub fn clamp(valid_from: Timestamp, valid_until: Timestamp, max_grant_days: u32) -> Placement {
    let limit = valid_from.saturating_add_days(i64::from(max_grant_days));
    if valid_until > limit {
        Placement {
            valid_until: limit,
            clamped: true,
        }
    } else {
        Placement {
            valid_until,
            clamped: false,
        }
    }
}

/// Steps 5 and 6 for a grant, given what the mirror holds for its key id
/// (`existing`), whether that id is tombstoned, and whether the grant's
/// reservation is tombstoned (a check-in closed it).
///
/// Step 5, in the contract's order: a tombstoned key, or a `pre_issued`
/// grant for a checked-in reservation, is `revoked`; a final key is
/// `illegal_transition` for a higher version and `noop` otherwise; a live
/// key at or above the incoming version is `noop`. Beyond the page: a live
/// `active` key asked to move back to `pre_issued` (at a higher version) is
/// `illegal_transition`, the whitelist's answer.
/// Step 6: the clamped `valid_until` at or before `now` is `expired`.
pub fn plan_grant(
    existing: Option<&KeyView>,
    key_tombstoned: bool,
    reservation_tombstoned: bool,
    grant: &Grant,
    now: Timestamp,
    max_grant_days: u32,
) -> GrantPlan {
    let reject = |reason| GrantPlan::Reject {
        reason,
        clamped: false,
    };
    let wanted = KeyState::from(grant.state);
    if key_tombstoned || (wanted == KeyState::PreIssued && reservation_tombstoned) {
        return reject(Reason::Revoked);
    }
    if let Some(k) = existing {
        if k.state.is_final() {
            return if grant.version > k.version {
                reject(Reason::IllegalTransition)
            } else {
                GrantPlan::Noop
            };
        }
        if k.version >= grant.version {
            return GrantPlan::Noop;
        }
        if k.state != wanted && !may_move(k.state, wanted) {
            return reject(Reason::IllegalTransition);
        }
    }
    let placement = clamp(grant.valid_from, grant.valid_until, max_grant_days);
    if placement.valid_until <= now {
        return GrantPlan::Reject {
            reason: Reason::Expired,
            clamped: placement.clamped,
        };
    }
    match existing {
        None => GrantPlan::Insert(placement),
        Some(_) => GrantPlan::Upgrade(placement),
    }
}

/// The plan for a revocation (`key.revoked`, a `supersedes` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokePlan {
    /// A live or used-up key becomes `revoked`: `applied`.
    Revoke,
    /// An unknown key id gets a tombstone: `applied`.
    Tombstone,
    /// A final key or an existing tombstone: `noop`.
    Noop,
}

/// Step 5 for a revocation: a revoke always wins, whatever its version, so
/// the version plays no part. A `used_up` key is revoked too: the one move
/// it has left (mqtt.md 'Invariants').
pub fn plan_revoke(existing: Option<KeyState>, tombstoned: bool) -> RevokePlan {
    match existing {
        Some(s) if s.is_live() || s == KeyState::UsedUp => RevokePlan::Revoke,
        Some(_) => RevokePlan::Noop,
        None if tombstoned => RevokePlan::Noop,
        None => RevokePlan::Tombstone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KeyState::*;
    use lockhub_proto::event::PinTag;

    const DAY: i64 = Timestamp::MICROS_PER_DAY;

    fn now() -> Timestamp {
        Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
    }

    fn grant(version: u64, state: GrantState) -> Grant {
        Grant {
            key_id: "k-1".into(),
            version,
            state,
            check_in_id: Some("c-1".into()),
            reservation_id: Some("r-1".into()),
            doors: vec!["101".into()],
            valid_from: now().saturating_add_days(1),
            valid_until: now().saturating_add_days(10),
            pin_tag: PinTag([7; 32]),
            pin_key_id: "k1".into(),
            holder_ref: None,
            holder_name: None,
            schedule: None,
            max_uses: None,
        }
    }

    fn plan(existing: Option<KeyView>, g: &Grant) -> GrantPlan {
        plan_grant(existing.as_ref(), false, false, g, now(), 60)
    }

    fn view(version: u64, state: KeyState) -> Option<KeyView> {
        Some(KeyView { version, state })
    }

    fn rejected(reason: Reason) -> GrantPlan {
        GrantPlan::Reject {
            reason,
            clamped: false,
        }
    }

    #[test]
    fn state_names_round_trip_and_unknown_names_are_refused() {
        for s in KeyState::ALL {
            assert_eq!(KeyState::parse(s.as_str()), Some(s));
        }
        assert_eq!(KeyState::parse("Active"), None);
        assert_eq!(KeyState::parse(""), None);
    }

    #[test]
    fn pre_issued_and_active_are_live_and_revoked_expired_and_used_up_are_final() {
        assert!(PreIssued.is_live() && Active.is_live());
        assert!(Revoked.is_final() && Expired.is_final() && UsedUp.is_final());
        for s in KeyState::ALL {
            assert_ne!(s.is_live(), s.is_final());
        }
    }

    #[test]
    fn exactly_the_eight_whitelisted_transitions_are_allowed() {
        let legal = [
            (PreIssued, Active),
            (PreIssued, Revoked),
            (PreIssued, Expired),
            (PreIssued, UsedUp),
            (Active, Revoked),
            (Active, Expired),
            (Active, UsedUp),
            (UsedUp, Revoked),
        ];
        for from in KeyState::ALL {
            for to in KeyState::ALL {
                assert_eq!(
                    may_move(from, to),
                    legal.contains(&(from, to)),
                    "{} -> {}",
                    from.as_str(),
                    to.as_str()
                );
            }
        }
    }

    #[test]
    fn a_final_state_never_moves_anywhere() {
        for from in [Revoked, Expired] {
            for to in KeyState::ALL {
                assert!(!may_move(from, to));
            }
        }
    }

    #[test]
    fn a_used_up_key_moves_only_to_revoked() {
        for to in KeyState::ALL {
            assert_eq!(may_move(UsedUp, to), to == Revoked, "{}", to.as_str());
        }
    }

    #[test]
    fn a_new_key_is_inserted() {
        let g = grant(1, GrantState::Active);
        assert_eq!(
            plan(None, &g),
            GrantPlan::Insert(Placement {
                valid_until: g.valid_until,
                clamped: false
            })
        );
    }

    #[test]
    fn a_pre_issued_key_moves_to_active_at_a_higher_version() {
        let g = grant(2, GrantState::Active);
        assert!(matches!(
            plan(view(1, PreIssued), &g),
            GrantPlan::Upgrade(_)
        ));
    }

    #[test]
    fn a_live_key_moves_to_a_higher_version_in_the_same_state() {
        assert!(matches!(
            plan(view(1, Active), &grant(5, GrantState::Active)),
            GrantPlan::Upgrade(_)
        ));
        assert!(matches!(
            plan(view(1, PreIssued), &grant(2, GrantState::PreIssued)),
            GrantPlan::Upgrade(_)
        ));
    }

    #[test]
    fn an_active_key_cannot_go_back_to_pre_issued_even_at_a_higher_version() {
        assert_eq!(
            plan(view(1, Active), &grant(2, GrantState::PreIssued)),
            rejected(Reason::IllegalTransition)
        );
    }

    #[test]
    fn a_live_key_at_the_same_or_a_higher_version_makes_the_grant_a_noop() {
        for state in [PreIssued, Active] {
            assert_eq!(
                plan(view(3, state), &grant(3, GrantState::Active)),
                GrantPlan::Noop
            );
            assert_eq!(
                plan(view(3, state), &grant(2, GrantState::Active)),
                GrantPlan::Noop
            );
        }
    }

    #[test]
    fn a_final_key_refuses_a_higher_version_as_an_illegal_transition() {
        for state in [Revoked, Expired, UsedUp] {
            assert_eq!(
                plan(view(1, state), &grant(2, GrantState::Active)),
                rejected(Reason::IllegalTransition)
            );
        }
    }

    #[test]
    fn a_final_key_answers_the_same_or_a_lower_version_with_noop() {
        for state in [Revoked, Expired, UsedUp] {
            assert_eq!(
                plan(view(2, state), &grant(2, GrantState::Active)),
                GrantPlan::Noop
            );
            assert_eq!(
                plan(view(2, state), &grant(1, GrantState::PreIssued)),
                GrantPlan::Noop
            );
        }
    }

    #[test]
    fn a_tombstoned_key_id_is_revoked_whatever_the_grant() {
        for s in [GrantState::Active, GrantState::PreIssued] {
            assert_eq!(
                plan_grant(None, true, false, &grant(9, s), now(), 60),
                rejected(Reason::Revoked)
            );
        }
    }

    #[test]
    fn a_pre_issued_grant_for_a_checked_in_reservation_is_revoked() {
        let g = grant(1, GrantState::PreIssued);
        assert_eq!(
            plan_grant(None, false, true, &g, now(), 60),
            rejected(Reason::Revoked)
        );
    }

    #[test]
    fn an_active_grant_for_a_checked_in_reservation_is_not_refused() {
        let g = grant(1, GrantState::Active);
        assert!(matches!(
            plan_grant(None, false, true, &g, now(), 60),
            GrantPlan::Insert(_)
        ));
    }

    #[test]
    fn the_tombstone_check_comes_before_the_final_key_check() {
        let g = grant(1, GrantState::PreIssued);
        assert_eq!(
            plan_grant(view(1, Revoked).as_ref(), false, true, &g, now(), 60),
            rejected(Reason::Revoked)
        );
    }

    #[test]
    fn a_window_longer_than_max_grant_days_is_clamped() {
        let mut g = grant(1, GrantState::Active);
        g.valid_until = g.valid_from.saturating_add_days(90);
        assert_eq!(
            plan(None, &g),
            GrantPlan::Insert(Placement {
                valid_until: g.valid_from.saturating_add_days(60),
                clamped: true
            })
        );
    }

    #[test]
    fn a_window_of_exactly_max_grant_days_is_not_clamped() {
        let mut g = grant(1, GrantState::Active);
        g.valid_until = g.valid_from.saturating_add_days(60);
        assert!(!clamp(g.valid_from, g.valid_until, 60).clamped);
    }

    #[test]
    fn a_window_ending_at_or_before_now_is_expired() {
        let mut g = grant(1, GrantState::Active);
        g.valid_from = now().saturating_add_days(-3);
        g.valid_until = now();
        assert_eq!(plan(None, &g), rejected(Reason::Expired));
        g.valid_until = now().saturating_add_micros(1);
        assert!(matches!(plan(None, &g), GrantPlan::Insert(_)));
    }

    #[test]
    fn a_window_the_clamp_pulls_into_the_past_is_expired_and_says_clamped() {
        let mut g = grant(1, GrantState::Active);
        g.valid_from = Timestamp(now().0 - 70 * DAY);
        g.valid_until = now().saturating_add_days(5);
        assert_eq!(
            plan(None, &g),
            GrantPlan::Reject {
                reason: Reason::Expired,
                clamped: true
            }
        );
    }

    #[test]
    fn an_upgrade_to_an_expired_window_is_expired() {
        let mut g = grant(2, GrantState::Active);
        g.valid_from = now().saturating_add_days(-2);
        g.valid_until = now().saturating_add_days(-1);
        assert_eq!(plan(view(1, PreIssued), &g), rejected(Reason::Expired));
    }

    #[test]
    fn a_revoke_revokes_a_live_key() {
        assert_eq!(plan_revoke(Some(PreIssued), false), RevokePlan::Revoke);
        assert_eq!(plan_revoke(Some(Active), false), RevokePlan::Revoke);
    }

    #[test]
    fn a_revoke_revokes_a_used_up_key_its_one_move_left() {
        assert_eq!(plan_revoke(Some(UsedUp), false), RevokePlan::Revoke);
    }

    #[test]
    fn a_revoke_of_a_final_key_is_a_noop() {
        assert_eq!(plan_revoke(Some(Revoked), false), RevokePlan::Noop);
        assert_eq!(plan_revoke(Some(Expired), false), RevokePlan::Noop);
    }

    #[test]
    fn a_revoke_of_an_unknown_key_leaves_a_tombstone_once() {
        assert_eq!(plan_revoke(None, false), RevokePlan::Tombstone);
        assert_eq!(plan_revoke(None, true), RevokePlan::Noop);
    }
}
