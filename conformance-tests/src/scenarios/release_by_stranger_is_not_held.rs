use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn release_by_stranger_is_not_held(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
