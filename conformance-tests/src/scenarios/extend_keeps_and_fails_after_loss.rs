use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn extend_keeps_and_fails_after_loss(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
