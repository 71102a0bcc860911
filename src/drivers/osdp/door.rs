//! What a door on an OSDP reader sends and reads (osdp.md, Opening the door
//! and Door contact), as pure functions: the osdp_OUT for a grant, the LED
//! and buzzer feedback, the door contact from an input report.

use super::cp::codec::{Command, LedSpec, color};
use crate::config::ReaderDoorConfig;

/// osdp_OUT control code 0x05: temporary on, then back to the permanent
/// state when the timer runs out.
pub const OUT_TEMPORARY_ON: u8 = 0x05;
/// The buzzer's default tone.
const TONE: u8 = 2;

/// `unlock_ms` in the osdp_OUT timer's units of 100 ms, rounded up (a
/// strike is never released early).
pub fn timer_units(unlock_ms: u16) -> u16 {
    unlock_ms.div_ceil(100)
}

/// The osdp_OUT that opens `door`.
pub fn unlock(door: &ReaderDoorConfig) -> Command {
    Command::Out {
        output: door.output,
        control: OUT_TEMPORARY_ON,
        timer: timer_units(door.unlock_ms),
    }
}

/// A grant: green for the unlock time (`unlock_ms`, whoever drives the
/// strike), one short beep.
pub fn granted(unlock_ms: u16) -> [Command; 2] {
    [
        Command::Led(LedSpec {
            on: 10,
            off: 0,
            on_color: color::GREEN,
            off_color: color::GREEN,
            timer: timer_units(unlock_ms),
        }),
        Command::Buzzer {
            tone: TONE,
            on: 1,
            off: 0,
            count: 1,
        },
    ]
}

/// A denial: red for 1 s, two short beeps.
pub fn denied() -> [Command; 2] {
    [
        Command::Led(LedSpec {
            on: 10,
            off: 0,
            on_color: color::RED,
            off_color: color::RED,
            timer: 10,
        }),
        Command::Buzzer {
            tone: TONE,
            on: 1,
            off: 1,
            count: 2,
        },
    ]
}

/// A locked-out keypad: red flashing (for 3 s after each attempt).
pub fn locked_out() -> [Command; 1] {
    [Command::Led(LedSpec {
        on: 2,
        off: 2,
        on_color: color::RED,
        off_color: color::BLACK,
        timer: 30,
    })]
}

/// Whether the door is open, from an osdp_ISTATR (one entry per input,
/// true = active); `None` when the door has no contact or the report does
/// not reach its input.
pub fn contact_open(door: &ReaderDoorConfig, inputs: &[bool]) -> Option<bool> {
    let active = *inputs.get(usize::from(door.contact_input?))?;
    Some(active != door.contact_inverted)
}

/// Whether an osdp_OSTATR shows `output` on.
pub fn output_on(status: &[u8], output: u8) -> bool {
    status.get(usize::from(output)).is_some_and(|&b| b != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door(contact_input: Option<u8>, contact_inverted: bool) -> ReaderDoorConfig {
        ReaderDoorConfig {
            name: "201".into(),
            reader: "r-201".into(),
            output: 1,
            contact_input,
            contact_inverted,
            unlock_ms: 5000,
        }
    }

    #[test]
    fn the_timer_is_unlock_ms_in_tenths_of_a_second_rounded_up() {
        assert_eq!(timer_units(5000), 50);
        assert_eq!(timer_units(1), 1);
        assert_eq!(timer_units(101), 2);
        assert_eq!(timer_units(65535), 656);
        assert_eq!(
            unlock(&door(None, false)),
            Command::Out {
                output: 1,
                control: 0x05,
                timer: 50
            }
        );
    }

    #[test]
    fn the_contact_is_its_input_active_unless_inverted() {
        assert_eq!(
            contact_open(&door(Some(1), false), &[false, true]),
            Some(true)
        );
        assert_eq!(
            contact_open(&door(Some(1), true), &[false, true]),
            Some(false)
        );
        assert_eq!(
            contact_open(&door(Some(0), false), &[false, true]),
            Some(false)
        );
        assert_eq!(contact_open(&door(Some(2), false), &[false, true]), None);
        assert_eq!(contact_open(&door(None, false), &[true]), None);
    }

    #[test]
    fn an_output_status_shows_the_right_output() {
        assert!(output_on(&[0, 1], 1));
        assert!(!output_on(&[1, 0], 1));
        assert!(!output_on(&[1], 1));
    }

    #[test]
    fn grant_feedback_is_green_for_the_unlock_time_and_one_beep() {
        let [led, buz] = granted(door(None, false).unlock_ms);
        assert!(
            matches!(led, Command::Led(l) if l.on > 0 && l.off == 0 && l.on_color == color::GREEN && l.timer == 50)
        );
        assert!(matches!(
            buz,
            Command::Buzzer {
                tone: 2,
                count: 1,
                ..
            }
        ));
        let [led, buz] = denied();
        assert!(matches!(led, Command::Led(l) if l.on_color == color::RED && l.timer == 10));
        assert!(matches!(buz, Command::Buzzer { count: 2, .. }));
    }
}
