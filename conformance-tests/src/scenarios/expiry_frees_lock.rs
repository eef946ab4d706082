use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn expiry_frees_lock(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
