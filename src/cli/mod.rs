//! The command-line clients: `spate pub`, `spate sub`, `spate stream` and
//! `spate aggregate`, each a plain client of a running server's ports
//! (ingest, subscribe, admin), as any other program would be.

pub mod aggregate;
pub mod publish;
pub mod stream;
pub mod sub;
