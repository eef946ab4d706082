use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn paused_holder_write_rejected(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
