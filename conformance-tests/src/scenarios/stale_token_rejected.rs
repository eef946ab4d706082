use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn stale_token_rejected(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
