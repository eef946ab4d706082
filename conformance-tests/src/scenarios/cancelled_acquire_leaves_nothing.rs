use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn cancelled_acquire_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
