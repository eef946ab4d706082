use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn late_release_keeps_new_holder(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
