//! distlock backend: redis (work in progress)
