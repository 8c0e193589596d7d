//! The hand-over between a blocking caller and the poller, under every order of their
//! steps (a deterministic scheduler: proptest picks who runs next), with the real
//! [`Callers`] and a model of the rest: the poller's loop as `poller.rs` runs it in event
//! mode (the mode that sleeps the most; busy and adaptive only poll more), one CQ, its
//! arming and its completion channel, the kick eventfd, and a caller making one call after
//! another (`Engine::spin`, then park).
//!
//! No timeout ever fires here: the poller wakes only from a kick or a completion event. The
//! invariant checked after every step is that a parked caller never waits on a poller
//! asleep with nothing to wake it: that would cost the call the poller's whole timeout.

use proptest::prelude::*;

use super::Callers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// No call outstanding.
    Idle,
    /// A call is outstanding; about to poll on its own thread.
    Enter,
    /// Polling its CQ (`Engine::spin`), having seen `seen` completions served.
    Spinning { seen: u32 },
    /// Leaving its polling; `progressed`: it received something.
    Leave { progressed: bool },
    /// Parked until the poller serves its response.
    Parked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poller {
    /// Top of the loop.
    Top,
    /// Callers drive: arm the CQ if nobody spins on it, look once more, sleep if quiet.
    ArmUnspun,
    /// Back from the callers' window: one look at the CQ whatever happened.
    LookAfterWindow,
    /// Nobody drives: look at the CQ.
    Poll,
    /// Nothing there: arm, look once more, sleep if quiet.
    ArmAll,
    /// In `epoll_wait`; then goes to `then`.
    Sleeping { then: Then },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    LookAfterWindow,
    Top,
}

struct World {
    callers: Callers,
    caller: Caller,
    poller: Poller,
    /// The poller's `callers_epoch`.
    last_seen: u64,
    /// The poller's `kicked`: a pass over the CQs is owed.
    owed: bool,
    /// The outstanding call's response is in the CQ, or was taken.
    arrived: bool,
    /// The outstanding call's response was processed (it is in the call table).
    answered: bool,
    /// Completions in the CQ.
    in_cq: u32,
    /// Completions processed, by anyone (`Engine::completions_seen`).
    served: u32,
    armed: bool,
    /// The completion channel is readable.
    event: bool,
    /// The kick eventfd is readable.
    kick: bool,
    calls_done: u32,
}

impl World {
    fn new() -> World {
        World {
            callers: Callers::default(),
            caller: Caller::Idle,
            poller: Poller::Top,
            last_seen: 0,
            owed: false,
            arrived: false,
            answered: false,
            in_cq: 0,
            served: 0,
            armed: false,
            event: false,
            kick: false,
            calls_done: 0,
        }
    }

    /// Takes a completion from the CQ, if there is one: the call's response.
    fn poll(&mut self) -> bool {
        if self.in_cq == 0 {
            return false;
        }
        self.in_cq -= 1;
        self.served += 1;
        self.answered = true;
        if self.caller == Caller::Parked {
            // The delivering thread unparks the caller, its call done.
            self.caller = Caller::Idle;
            self.calls_done += 1;
        }
        true
    }

    /// The steps that can run now: (actor, variant).
    fn enabled(&self) -> Vec<(u8, u8)> {
        let mut steps = Vec::new();
        match self.caller {
            Caller::Parked => {}
            Caller::Spinning { .. } => {
                steps.push((0, 0)); // look at the CQ
                steps.push((0, 1)); // the spin budget runs out
            }
            _ => steps.push((0, 0)),
        }
        let asleep = matches!(self.poller, Poller::Sleeping { .. });
        if !asleep || self.kick || self.event {
            steps.push((1, 0));
        }
        if self.caller != Caller::Idle && !self.arrived {
            steps.push((2, 0));
        }
        steps
    }

    fn step(&mut self, (actor, variant): (u8, u8)) {
        match actor {
            0 => self.caller_step(variant),
            1 => self.poller_step(),
            _ => self.arrive(),
        }
    }

    /// The response reaches the CQ; an armed CQ raises one event and disarms.
    fn arrive(&mut self) {
        self.arrived = true;
        self.in_cq += 1;
        if std::mem::take(&mut self.armed) {
            self.event = true;
        }
    }

    fn caller_step(&mut self, variant: u8) {
        self.caller = match self.caller {
            Caller::Idle => {
                self.arrived = false;
                self.answered = false;
                Caller::Enter
            }
            // The call table is looked at before each spell of polling.
            Caller::Enter if self.answered => {
                self.calls_done += 1;
                Caller::Idle
            }
            Caller::Enter => {
                self.callers.enter();
                Caller::Spinning { seen: self.served }
            }
            Caller::Spinning { seen } if variant == 0 => {
                if self.poll() || self.served != seen {
                    Caller::Leave { progressed: true }
                } else {
                    Caller::Spinning { seen }
                }
            }
            Caller::Spinning { .. } => Caller::Leave { progressed: false },
            Caller::Leave { progressed } => {
                if progressed {
                    self.callers.progressed();
                }
                self.callers.leave();
                if progressed {
                    // Something was received: back to the call table.
                    Caller::Enter
                } else {
                    // About to park: the poller must take over. It parks only if the call
                    // table still has no response.
                    self.kick = true;
                    if self.answered {
                        self.calls_done += 1;
                        Caller::Idle
                    } else {
                        Caller::Parked
                    }
                }
            }
            Caller::Parked => unreachable!("a parked caller takes no step"),
        };
    }

    fn poller_step(&mut self) {
        self.poller = match self.poller {
            Poller::Top => {
                if !std::mem::take(&mut self.owed) && self.callers.drive(&mut self.last_seen) {
                    Poller::ArmUnspun
                } else {
                    Poller::Poll
                }
            }
            Poller::ArmUnspun => {
                // Only a CQ nobody spins on is armed and looked at.
                let unspun = self.callers_polling() == 0;
                if unspun {
                    self.armed = true;
                }
                let found = unspun && self.poll();
                if found || self.owed {
                    Poller::LookAfterWindow
                } else {
                    Poller::Sleeping {
                        then: Then::LookAfterWindow,
                    }
                }
            }
            Poller::LookAfterWindow => {
                self.poll();
                Poller::Top
            }
            Poller::Poll => {
                if self.poll() {
                    Poller::Top
                } else {
                    Poller::ArmAll
                }
            }
            Poller::ArmAll => {
                self.armed = true;
                if self.poll() || self.owed {
                    Poller::Top
                } else {
                    Poller::Sleeping { then: Then::Top }
                }
            }
            Poller::Sleeping { then } => {
                if std::mem::take(&mut self.event) {
                    self.owed = true;
                }
                if std::mem::take(&mut self.kick) {
                    self.callers.handed_over(&mut self.last_seen);
                    self.owed = true;
                }
                match then {
                    Then::LookAfterWindow => Poller::LookAfterWindow,
                    Then::Top => Poller::Top,
                }
            }
        };
    }

    fn callers_polling(&self) -> usize {
        self.callers
            .polling
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A parked caller is never left with a poller that only a timeout would wake.
    fn check(&self) {
        if self.caller != Caller::Parked {
            return;
        }
        if let Poller::Sleeping { .. } = self.poller {
            let wakes = self.kick || self.event || (self.armed && !self.arrived);
            assert!(
                wakes,
                "parked caller, poller asleep with nothing to wake it: armed {}, response \
                 arrived {}, in CQ {}",
                self.armed, self.arrived, self.in_cq
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn a_parked_caller_never_waits_for_a_timeout(choices in proptest::collection::vec(any::<u8>(), 1..400)) {
        let mut world = World::new();
        for choice in choices {
            let steps = world.enabled();
            prop_assert!(!steps.is_empty(), "nothing can run");
            let step = steps[usize::from(choice) % steps.len()];
            world.step(step);
            world.check();
        }
        // Then every call finishes without a timeout: fair turns, the response arriving.
        let target = world.calls_done + 2;
        for turn in 0..10_000u32 {
            if world.calls_done >= target {
                break;
            }
            let steps = world.enabled();
            prop_assert!(!steps.is_empty(), "stuck: {:?} {:?}", world.caller, world.poller);
            // Fair: rotate over the actors; callers never give up early here.
            let step = steps[turn as usize % steps.len()];
            world.step(if step == (0, 1) { (0, 0) } else { step });
            world.check();
        }
        prop_assert!(world.calls_done >= target, "calls stopped finishing: {:?} {:?}", world.caller, world.poller);
    }
}
