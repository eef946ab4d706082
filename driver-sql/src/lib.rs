//! distlock backend: sql (work in progress)
