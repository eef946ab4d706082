use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn hostile_keys_isolated(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
