use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn fencing_tokens_increase(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
