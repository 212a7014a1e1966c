//! The pgoutput messages CDC mode reads that the replication crate hands
//! over as raw bytes: Relation (a table's columns) and Insert (a row), in
//! protocol version 1 ("Logical Replication Message Formats" in the
//! PostgreSQL manual). Begin and Commit come decoded from the crate.
//!
//! The bytes come from the network: every read is checked, and anything
//! short, unknown or inconsistent is a [`DecodeError`], never a panic.

use std::collections::HashMap;

/// A message of the stream, as far as the relay needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A table's description; sent before its first row in a session and
    /// again whenever it changes.
    Relation(Relation),
    /// A new row of the table `relation` (its OID).
    Insert { relation: u32, tuple: Vec<Value> },
    /// A message the relay has no use for (Type, Origin, Truncate, Update,
    /// Delete…), by its tag. The publication only carries inserts into the
    /// outbox, so the caller decides whether its presence is an error.
    Other(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// One column of a row, in text form (the relay does not ask for binary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the server did not send because it did not change;
    /// never part of an insert.
    Unchanged,
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message ends early: {0} needs more bytes")]
    Short(&'static str),
    #[error("pgoutput message has {0} trailing byte(s)")]
    Trailing(usize),
    #[error("pgoutput {what} is not UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("pgoutput {what}: unexpected byte {byte:#04x}")]
    Unexpected { what: &'static str, byte: u8 },
    #[error("pgoutput {what}: negative length {length}")]
    NegativeLength { what: &'static str, length: i64 },
    #[error("empty pgoutput message")]
    Empty,
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Short(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        let mut raw = [0; 2];
        raw.copy_from_slice(self.take(2, what)?);
        Ok(i16::from_be_bytes(raw))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        let mut raw = [0; 4];
        raw.copy_from_slice(self.take(4, what)?);
        Ok(i32::from_be_bytes(raw))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let mut raw = [0; 4];
        raw.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_be_bytes(raw))
    }

    fn count(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let count = self.i16(what)?;
        usize::try_from(count).map_err(|_| DecodeError::NegativeLength {
            what,
            length: i64::from(count),
        })
    }

    /// A NUL-terminated string.
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or(DecodeError::Short(what))?;
        let text = self.take(end, what)?;
        self.take(1, what)?;
        text_of(text, what)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

fn text_of(bytes: &[u8], what: &'static str) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::NotUtf8 { what })
}

/// Decodes one message (the `XLogData` payload).
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut reader = Reader { bytes };
    let tag = *bytes.first().ok_or(DecodeError::Empty)?;
    reader.take(1, "tag")?;
    let message = match tag {
        b'R' => Message::Relation(relation(&mut reader)?),
        b'I' => {
            let relation = reader.u32("insert relation")?;
            match reader.u8("insert kind")? {
                b'N' => {}
                byte => {
                    return Err(DecodeError::Unexpected {
                        what: "insert kind",
                        byte,
                    });
                }
            }
            Message::Insert {
                relation,
                tuple: tuple(&mut reader)?,
            }
        }
        other => return Ok(Message::Other(other)),
    };
    reader.finish()?;
    Ok(message)
}

fn relation(reader: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = reader.u32("relation oid")?;
    let namespace = reader.string("relation namespace")?;
    let name = reader.string("relation name")?;
    reader.u8("replica identity")?;
    let count = reader.count("relation column count")?;
    let mut columns = Vec::with_capacity(count.min(reader.bytes.len()));
    for _ in 0..count {
        reader.u8("column flags")?;
        columns.push(reader.string("column name")?);
        reader.u32("column type")?;
        reader.i32("column type modifier")?;
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        columns,
    })
}

fn tuple(reader: &mut Reader<'_>) -> Result<Vec<Value>, DecodeError> {
    let count = reader.count("tuple column count")?;
    let mut values = Vec::with_capacity(count.min(reader.bytes.len()));
    for _ in 0..count {
        values.push(match reader.u8("column kind")? {
            b'n' => Value::Null,
            b'u' => Value::Unchanged,
            b't' => {
                let length = reader.i32("column length")?;
                let length = usize::try_from(length).map_err(|_| DecodeError::NegativeLength {
                    what: "column value",
                    length: i64::from(length),
                })?;
                Value::Text(text_of(
                    reader.take(length, "column value")?,
                    "column value",
                )?)
            }
            byte => {
                return Err(DecodeError::Unexpected {
                    what: "column kind (binary values are not requested)",
                    byte,
                });
            }
        });
    }
    Ok(values)
}

/// A row as named columns, by its relation's description.
#[derive(Debug, Default)]
pub struct Relations {
    known: HashMap<u32, Relation>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelationError {
    #[error("a row of relation {0} came before its description")]
    UnknownRelation(u32),
    #[error("relation {relation} has {columns} column(s) but the row has {values}")]
    Width {
        relation: String,
        columns: usize,
        values: usize,
    },
}

impl Relations {
    pub fn learn(&mut self, relation: Relation) {
        self.known.insert(relation.oid, relation);
    }

    /// The row's columns by name, with the relation's qualified name.
    pub fn named(
        &self,
        relation: u32,
        tuple: Vec<Value>,
    ) -> Result<(String, HashMap<String, Value>), RelationError> {
        let known = self
            .known
            .get(&relation)
            .ok_or(RelationError::UnknownRelation(relation))?;
        let qualified = format!("{}.{}", known.namespace, known.name);
        if known.columns.len() != tuple.len() {
            return Err(RelationError::Width {
                relation: qualified,
                columns: known.columns.len(),
                values: tuple.len(),
            });
        }
        Ok((
            qualified,
            known.columns.iter().cloned().zip(tuple).collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cstring(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(text.as_bytes());
        out.push(0);
    }

    fn relation_bytes(oid: u32, columns: &[&str]) -> Vec<u8> {
        let mut out = vec![b'R'];
        out.extend_from_slice(&oid.to_be_bytes());
        cstring(&mut out, "public");
        cstring(&mut out, "outbox");
        out.push(b'd');
        out.extend_from_slice(&i16::try_from(columns.len()).unwrap().to_be_bytes());
        for column in columns {
            out.push(0);
            cstring(&mut out, column);
            out.extend_from_slice(&25_u32.to_be_bytes());
            out.extend_from_slice(&(-1_i32).to_be_bytes());
        }
        out
    }

    fn insert_bytes(oid: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut out = vec![b'I'];
        out.extend_from_slice(&oid.to_be_bytes());
        out.push(b'N');
        out.extend_from_slice(&i16::try_from(values.len()).unwrap().to_be_bytes());
        for value in values {
            match value {
                None => out.push(b'n'),
                Some(text) => {
                    out.push(b't');
                    out.extend_from_slice(&i32::try_from(text.len()).unwrap().to_be_bytes());
                    out.extend_from_slice(text.as_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn a_relation_and_its_row_decode_to_named_columns() {
        let Message::Relation(relation) =
            decode(&relation_bytes(16_390, &["id", "payload", "traceparent"])).unwrap()
        else {
            panic!("not a relation");
        };
        assert_eq!(relation.columns, ["id", "payload", "traceparent"]);
        let mut relations = Relations::default();
        relations.learn(relation);
        let Message::Insert { relation, tuple } = decode(&insert_bytes(
            16_390,
            &[Some("0190f5d2"), Some("{\"a\": 1}"), None],
        ))
        .unwrap() else {
            panic!("not an insert");
        };
        let (table, row) = relations.named(relation, tuple).unwrap();
        assert_eq!(table, "public.outbox");
        assert_eq!(row["payload"], Value::Text("{\"a\": 1}".to_owned()));
        assert_eq!(row["traceparent"], Value::Null);
    }

    #[test]
    fn broken_messages_are_errors() {
        let insert = insert_bytes(7, &[Some("abc")]);
        for cut in 0..insert.len() {
            assert!(decode(&insert[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = insert.clone();
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(DecodeError::Trailing(1)));
        let mut binary = insert_bytes(7, &[Some("abc")]);
        binary[8] = b'b';
        assert!(matches!(
            decode(&binary),
            Err(DecodeError::Unexpected { .. })
        ));
        let mut not_utf8 = insert_bytes(7, &[Some("abc")]);
        let last = not_utf8.len() - 1;
        not_utf8[last] = 0xff;
        assert_eq!(
            decode(&not_utf8),
            Err(DecodeError::NotUtf8 {
                what: "column value"
            })
        );
        assert_eq!(decode(b"Y\0\0"), Ok(Message::Other(b'Y')));
        let relations = Relations::default();
        assert_eq!(
            relations.named(7, vec![]),
            Err(RelationError::UnknownRelation(7))
        );
    }

    #[test]
    fn a_row_whose_width_is_not_its_relations_is_an_error() {
        let mut relations = Relations::default();
        let Ok(Message::Relation(relation)) = decode(&relation_bytes(9, &["id", "payload"])) else {
            panic!("not a relation");
        };
        relations.learn(relation);
        assert!(matches!(
            relations.named(9, vec![Value::Null]),
            Err(RelationError::Width {
                columns: 2,
                values: 1,
                ..
            })
        ));
    }

    proptest! {
        /// No bytes make the decoder panic (or allocate past the input).
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn any_bytes_after_a_valid_tag_decode_or_fail_cleanly(
            tag in prop::sample::select(vec![b'R', b'I']),
            rest in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut bytes = vec![tag];
            bytes.extend(rest);
            let _ = decode(&bytes);
        }
    }
}
