//! Custom events that tests and the HIL levels submit to an agent: a numeric `id` attribute to
//! find each one again at the broker, and optional padding text that compresses about as badly
//! as real sensor dumps (to about 60 %).
//!
//! Invariants:
//! - The same id and padding give the same event, byte for byte (the text is a xorshift stream
//!   seeded by the id), so a re-sent event is an exact duplicate.
//! - `event_id` reads back exactly the id `custom_event` wrote.

use edgewatch_proto::v1::{Attribute, CustomEvent, Event, attribute, event};

/// A custom event `name` with attribute `id`, and `padding` bytes of pseudo-random letters in
/// attribute `padding` when `padding > 0`.
pub fn custom_event(name: &str, id: i64, padding: usize) -> Event {
    let mut attributes = vec![Attribute {
        key: "id".into(),
        value: Some(attribute::Value::IntValue(id)),
    }];
    if padding > 0 {
        attributes.push(Attribute {
            key: "padding".into(),
            value: Some(attribute::Value::StringValue(padding_text(id, padding))),
        });
    }
    Event {
        kind: Some(event::Kind::Custom(CustomEvent {
            name: name.into(),
            attributes,
        })),
        ..Event::default()
    }
}

/// `len` pseudo-random lowercase letters seeded by `id`.
fn padding_text(id: i64, len: usize) -> String {
    let mut state = id as u64 ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect()
}

/// The `id` attribute of a custom event.
pub fn event_id(event: &Event) -> Option<i64> {
    let Some(event::Kind::Custom(custom)) = &event.kind else {
        return None;
    };
    custom
        .attributes
        .iter()
        .find_map(|a| match (&a.key[..], &a.value) {
            ("id", Some(attribute::Value::IntValue(id))) => Some(*id),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_reads_back_and_the_padding_is_the_same_for_the_same_id() {
        let a = custom_event("test", 42, 100);
        assert_eq!(event_id(&a), Some(42));
        assert_eq!(a, custom_event("test", 42, 100));
        assert_ne!(a, custom_event("test", 43, 100));
        let Some(event::Kind::Custom(custom)) = &a.kind else {
            panic!("not a custom event");
        };
        assert_eq!(custom.attributes.len(), 2);
    }

    #[test]
    fn no_padding_means_no_padding_attribute() {
        let Some(event::Kind::Custom(custom)) = custom_event("test", 1, 0).kind else {
            panic!("not a custom event");
        };
        assert_eq!(custom.attributes.len(), 1);
    }
}
