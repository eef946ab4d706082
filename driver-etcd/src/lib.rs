//! distlock backend: etcd (work in progress)
