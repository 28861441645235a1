//! A re-driven message's identity.
//!
//! Service Bus duplicate detection answers a send whose MessageId it saw inside its
//! window with 201 and drops the message, telling nobody; and the window is judged by the
//! broker's clock, which no client can read exactly. So the dead-letter tool never
//! re-sends a dead letter under its own MessageId: the copy gets a MessageId of its own
//! ([`copy_message_id`]), which the broker has never seen and cannot drop, and names the
//! message it copies in the application property [`ORIGINAL_MESSAGE_ID`]. The consumer
//! keys its inbox by [`identity`]: the original MessageId when the property names one,
//! so a copy and the message it copies (and any other copy of it) are one message.

use sha2::{Digest, Sha256};

use super::{InvalidMessage, MessageId};

/// The application property of a re-drive copy that names the MessageId it stands for.
/// Read ignoring case: the REST runtime API carries properties as HTTP headers, whose
/// names HTTP stacks lower-case.
pub const ORIGINAL_MESSAGE_ID: &str = "ClaimsPaymentsOriginalMessageId";

/// The message a delivery stands for: the MessageId named by [`ORIGINAL_MESSAGE_ID`] when
/// the message carries it (a re-drive copy), else the broker's own MessageId.
pub fn identity(broker: MessageId, original: Option<&str>) -> Result<MessageId, InvalidMessage> {
    match original {
        None => Ok(broker),
        Some(text) => MessageId::parse(text).map_err(|e| InvalidMessage {
            field: ORIGINAL_MESSAGE_ID,
            problem: e.problem,
        }),
    }
}

/// The MessageId of the copy of the dead letter `(message_id, sequence_number)`.
///
/// Derived, so that sending the same dead letter twice (a crash or a lost lock between
/// the send and the delete) gives the same MessageId: if the first send was accepted the
/// broker drops the second as a duplicate, and if it was not, the second is the only copy.
/// Either way one copy is on the queue. A dead letter's SequenceNumber is unique in its
/// queue, so the copies of two dead letters (a producer's re-send, a copy dead-lettered
/// again) never share a MessageId. Without a SequenceNumber each send gets a random one:
/// a second send is then a second copy, which the consumer recognises by [`identity`].
pub fn copy_message_id(message_id: &str, sequence_number: Option<i64>) -> String {
    let Some(sequence_number) = sequence_number else {
        return format!("redrive-{}", uuid::Uuid::new_v4().simple());
    };
    let mut hash = Sha256::new();
    hash.update((message_id.len() as u64).to_be_bytes());
    hash.update(message_id.as_bytes());
    hash.update(sequence_number.to_be_bytes());
    let digest = hash.finalize();
    format!("redrive-{}", hex::encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_stands_for_the_message_it_names() {
        let broker = MessageId::parse("redrive-1").unwrap();
        assert_eq!(identity(broker.clone(), None).unwrap(), broker);
        assert_eq!(
            identity(broker.clone(), Some("m-1")).unwrap().as_str(),
            "m-1"
        );
        let bad = identity(broker, Some("")).unwrap_err();
        assert_eq!(bad.field, ORIGINAL_MESSAGE_ID);
    }

    #[test]
    fn a_copy_id_is_the_same_for_one_dead_letter_and_differs_between_two() {
        let a = copy_message_id("m-1", Some(7));
        assert_eq!(a, copy_message_id("m-1", Some(7)));
        assert_ne!(a, copy_message_id("m-1", Some(8)));
        assert_ne!(a, copy_message_id("m-17", Some(7)));
        assert_ne!(a, "m-1");
        assert!(MessageId::parse(&a).is_ok());
        assert_ne!(copy_message_id("m-1", None), copy_message_id("m-1", None));
    }
}
