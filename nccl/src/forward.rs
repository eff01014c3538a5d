//! The macro that writes the exported functions: for each entry, `ncclX` and its profiling alias
//! `pncclX`, the same function under two names, calling the entry's oxccl function with the same
//! arguments and returning what it returns as NCCL 2.27 would (`differences::IntoNccl`).

/// `fn ncclX / pncclX(arguments) -> type = target;` for each function: both names call `target`.
macro_rules! forward {
    ($(
        $(#[doc = $doc:expr])*
        fn $name:ident / $alias:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $to:path;
    )*) => {$(
        forward!(@one [$(#[doc = $doc])*] $name($($arg: $ty),*) -> $ret = $to);
        forward!(@one [#[doc = concat!("`", stringify!($name), "` under its profiling name.")]]
            $alias($($arg: $ty),*) -> $ret = $to);
    )*};
    (@one [$($doc:tt)*] $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $to:path) => {
        $($doc)*
        ///
        /// # Safety
        ///
        /// The contract of the oxccl function of the same name (include/oxccl.h).
        #[unsafe(no_mangle)]
        // Some oxccl functions are safe to call: then the block below needs no `unsafe`.
        #[allow(unused_unsafe)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's arguments, under the caller's contract, which is the oxccl
            // function's.
            let result = unsafe { $to($($arg),*) };
            $crate::differences::IntoNccl::into_nccl(result)
        }
    };
}
