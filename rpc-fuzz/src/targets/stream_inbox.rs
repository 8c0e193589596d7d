//! One direction of a stream fed anything a peer can send (messages, `Messages` frames with
//! any payload, ends, at any sequence numbers, in any order, with a reader taking items
//! in between): a named error or progress, never a panic, and never more buffered than the
//! window allows.
use arbitrary::Arbitrary;
use bytes::Bytes;
use rpc_core::stream::flow::{Inbox, Item};
use rpc_core::stream::Window;

#[derive(Debug, Arbitrary)]
enum Frame {
    Message { seq: u32, len: u16 },
    Messages { seq: u32, payload: Vec<u8> },
    End { seq: u32 },
    Take { items: u8 },
    Return,
}

const MAX_MESSAGE: usize = 1024;

pub(crate) fn run(data: &[u8]) {
    let Some(frames) = crate::arbitrary_input::<Vec<Frame>>(data) else {
        return;
    };
    let asked = Window {
        messages: 64,
        bytes: 4096,
    };
    let mut inbox = Inbox::<()>::new(asked, MAX_MESSAGE);
    // Never below the protocol's initial window.
    let window = inbox.window();
    for frame in frames {
        let fed = match frame {
            Frame::Message { seq, len } => {
                inbox.on_message(seq, Bytes::from(vec![0; usize::from(len)]))
            }
            Frame::Messages { seq, payload } => inbox.on_batch(seq, payload.into()),
            Frame::End { seq } => inbox.on_end(seq, ()),
            Frame::Take { items } => {
                for _ in 0..items {
                    match inbox.pop() {
                        Some(Item::Message(m)) => assert!(m.len() <= MAX_MESSAGE),
                        Some(Item::Messages(_)) => panic!("pop handed out a whole batch"),
                        Some(Item::End(())) | None => break,
                    }
                }
                Ok(())
            }
            Frame::Return => {
                inbox.take_update();
                Ok(())
            }
        };
        if fed.is_err() {
            // The stream fails at its first broken rule.
            return;
        }
        let (messages, bytes) = inbox.buffered();
        assert!(messages <= u64::from(window.messages));
        assert!(bytes <= window.bytes + MAX_MESSAGE as u64);
    }
}
