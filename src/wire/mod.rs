//! The sans-IO wire codec.
