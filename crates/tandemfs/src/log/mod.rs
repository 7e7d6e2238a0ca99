//! `log`: the front-end operation log (NICFS): record headers kept apart from record data.
