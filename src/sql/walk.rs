//! A complete walk over pg_query's parse tree.
//!
//! pg_query's protobuf types all derive `serde::Serialize`, so a serializer that records what it
//! is handed visits every field of every node, including the ones a hand-written visitor would
//! forget (CTEs, EXPLAIN's and PREPARE's inner statement, ALTER ROLE's nested SET, ...). The
//! serializer turns the tree into a stream of events (a struct begins, a field starts, a scalar
//! value, a struct ends) and hands them to [`Collector`](super::collect::Collector), which keeps a
//! small stack and derives the facts the rules need. Nothing is allocated for the tree itself.

use serde::ser::{self, Serialize};
use std::fmt;

/// What a walk reports, in document order.
pub(crate) trait Events {
    /// A struct (a parse node or one of its parts) begins. `Node` wrappers are not reported.
    fn enter(&mut self, name: &'static str);
    /// The struct that began last ends.
    fn leave(&mut self);
    /// The next value belongs to this field of the innermost struct.
    fn field(&mut self, key: &'static str);
    /// A string value.
    fn string(&mut self, value: &str);
    /// An integer value (enumerations arrive as their number).
    fn int(&mut self, value: i64);
    /// A boolean value.
    fn boolean(&mut self, value: bool);
    /// An absent optional value.
    fn none(&mut self);
}

/// The walk never fails by itself; serde's contract still needs an error type.
#[derive(Debug)]
pub(crate) struct WalkError(String);

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WalkError {}

impl ser::Error for WalkError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        WalkError(msg.to_string())
    }
}

/// Walks `value` (a parse result or any node), reporting every part of it to `events`.
pub(crate) fn walk<T: Serialize + ?Sized, E: Events>(
    value: &T,
    events: &mut E,
) -> Result<(), WalkError> {
    value.serialize(&mut Walker { events })
}

struct Walker<'e, E> {
    events: &'e mut E,
}

/// The name pg_query gives its node wrapper struct; it carries no information of its own.
const NODE_WRAPPER: &str = "Node";

/// A struct being serialized; remembers whether it was reported (wrappers are not).
struct StructWalk<'w, 'e, E> {
    walker: &'w mut Walker<'e, E>,
    reported: bool,
}

macro_rules! ints {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name(self, v: $ty) -> Result<(), WalkError> {
            self.events.int(i64::try_from(v).unwrap_or(i64::MAX));
            Ok(())
        })*
    };
}

impl<'w, 'e, E: Events> ser::Serializer for &'w mut Walker<'e, E> {
    type Ok = ();
    type Error = WalkError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = StructWalk<'w, 'e, E>;
    type SerializeStructVariant = StructWalk<'w, 'e, E>;

    ints!(serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
          serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64);

    fn serialize_bool(self, v: bool) -> Result<(), WalkError> {
        self.events.boolean(v);
        Ok(())
    }
    fn serialize_f32(self, _: f32) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_f64(self, _: f64) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), WalkError> {
        self.events.string(v.encode_utf8(&mut [0u8; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), WalkError> {
        self.events.string(v);
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_none(self) -> Result<(), WalkError> {
        self.events.none();
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), WalkError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        value.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, WalkError> {
        Ok(self)
    }
    fn serialize_struct(
        self,
        name: &'static str,
        _: usize,
    ) -> Result<StructWalk<'w, 'e, E>, WalkError> {
        let reported = name != NODE_WRAPPER;
        if reported {
            self.events.enter(name);
        }
        Ok(StructWalk {
            walker: self,
            reported,
        })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<StructWalk<'w, 'e, E>, WalkError> {
        self.serialize_struct(variant, len)
    }
}

impl<E: Events> ser::SerializeStruct for StructWalk<'_, '_, E> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        if self.reported {
            self.walker.events.field(key);
        }
        value.serialize(&mut *self.walker)
    }
    fn end(self) -> Result<(), WalkError> {
        if self.reported {
            self.walker.events.leave();
        }
        Ok(())
    }
}

impl<E: Events> ser::SerializeStructVariant for StructWalk<'_, '_, E> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), WalkError> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<(), WalkError> {
        ser::SerializeStruct::end(self)
    }
}

/// Sequences, tuples and maps: every element is walked in place.
macro_rules! elements {
    ($($trait:ident :: $method:ident),*) => {
        $(impl<E: Events> ser::$trait for &mut Walker<'_, E> {
            type Ok = ();
            type Error = WalkError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), WalkError> {
                Ok(())
            }
        })*
    };
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl<E: Events> ser::SerializeMap for &mut Walker<'_, E> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, _: &T) -> Result<(), WalkError> {
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), WalkError> {
        Ok(())
    }
}
