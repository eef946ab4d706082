use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn waiter_acquires_after_release(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
