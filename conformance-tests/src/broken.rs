//! Deliberately broken backends.
