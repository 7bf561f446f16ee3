//! The SQLite store (the embedded default).
