use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn dropped_guard_released(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
