//! The `foo_server` module: method descriptors, the `Foo` trait users implement, and
//! `FooServer<T>`, the [`Service`](https://docs.rs/rpc-core) the server hosts.

use proc_macro2::TokenStream;
use quote::quote;

use crate::generator::{doc_attrs, doc_attrs_or, MethodKind, MethodModel, ServiceModel};

/// The server module of `service`.
pub(crate) fn generate(service: &ServiceModel) -> TokenStream {
    let ServiceModel {
        full_name,
        core,
        trait_ident,
        server_mod,
        server_ident,
        ..
    } = service;
    let methods = &service.methods;
    let mod_docs = doc_attrs(
        &format!("Generated server for `{full_name}`: implement `{trait_ident}` and serve it with `{server_ident}`."),
        &[],
    );
    let trait_docs = doc_attrs(
        &format!("The methods of `{full_name}`: implement this trait and host it with [`{server_ident}`]."),
        &service.docs,
    );
    let server_docs = doc_attrs(
        &format!("Serves an implementation of [`{trait_ident}`] as `{full_name}`: add it to a server with `add_service`."),
        &[],
    );
    let descriptors = methods.iter().map(|method| {
        let MethodModel {
            path,
            const_ident,
            kind,
            ..
        } = method;
        let docs = doc_attrs(&format!("Descriptor of `{path}`."), &[]);
        let kind = match kind {
            MethodKind::Unary => quote!(),
            MethodKind::ServerStreaming => {
                quote!(.with_kind(#core::server::MethodKind::ServerStreaming))
            }
            MethodKind::ClientStreaming => {
                quote!(.with_kind(#core::server::MethodKind::ClientStreaming))
            }
            MethodKind::Bidi => quote!(.with_kind(#core::server::MethodKind::Streaming)),
        };
        quote! {
            #docs
            pub const #const_ident: #core::server::MethodDescriptor =
                #core::server::MethodDescriptor::new(#path)#kind;
        }
    });
    let server_name = server_ident.to_string();
    let const_idents: Vec<_> = methods.iter().map(|m| &m.const_ident).collect();
    let trait_methods = methods.iter().map(|method| trait_method(core, method));
    let call_body = call_body(service);

    quote! {
        #mod_docs
        pub mod #server_mod {
            #(#descriptors)*

            /// Fully qualified name of the service.
            pub const SERVICE_NAME: &str = #full_name;

            #trait_docs
            pub trait #trait_ident: ::core::marker::Send + ::core::marker::Sync + 'static {
                #(#trait_methods)*
            }

            #server_docs
            pub struct #server_ident<T> {
                inner: ::std::sync::Arc<T>,
            }

            impl<T: #trait_ident> #server_ident<T> {
                /// Serves `inner`.
                pub fn new(inner: T) -> Self {
                    Self::from_arc(::std::sync::Arc::new(inner))
                }

                /// Serves an implementation that is shared with other code.
                pub const fn from_arc(inner: ::std::sync::Arc<T>) -> Self {
                    Self { inner }
                }

                /// Serves `inner`, every call first passing `interceptor` (which may
                /// check metadata and refuse the call with a status).
                pub fn with_interceptor(
                    inner: T,
                    interceptor: impl #core::Interceptor,
                ) -> #core::InterceptedService<Self> {
                    #core::InterceptedService::new(Self::new(inner), interceptor)
                }
            }

            impl<T> ::core::clone::Clone for #server_ident<T> {
                fn clone(&self) -> Self {
                    Self {
                        inner: ::std::sync::Arc::clone(&self.inner),
                    }
                }
            }

            impl<T> ::core::fmt::Debug for #server_ident<T> {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.debug_struct(#server_name).finish_non_exhaustive()
                }
            }

            impl<T> #core::server::NamedService for #server_ident<T> {
                const NAME: &'static str = SERVICE_NAME;
            }

            impl<T: #trait_ident> #core::server::Service for #server_ident<T> {
                fn name(&self) -> &'static str {
                    SERVICE_NAME
                }

                fn methods(&self) -> &'static [#core::server::MethodDescriptor] {
                    &[#(#const_idents),*]
                }

                fn call(
                    &self,
                    method_id: u32,
                    call: #core::server::ServerCall,
                ) -> #core::server::HandlerFuture {
                    #call_body
                }
            }
        }
    }
}

fn trait_method(core: &TokenStream, method: &MethodModel) -> TokenStream {
    let MethodModel {
        path,
        fn_ident,
        input,
        output,
        stream_ident,
        kind,
        ..
    } = method;
    let docs = doc_attrs_or(&format!("Handles `{path}`."), &method.docs);
    let request = if kind.streams_requests() {
        quote!(#core::Request<#core::Streaming<#input>>)
    } else {
        quote!(#core::Request<#input>)
    };
    if !kind.streams_responses() {
        return quote! {
            #docs
            fn #fn_ident(
                &self,
                request: #request,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<#core::Response<#output>, #core::Status>,
            > + ::core::marker::Send;
        };
    }
    let fn_name = fn_ident.to_string();
    let stream_docs = doc_attrs(
        &format!("The stream of messages `{fn_name}` answers with; an error ends the call with its status."),
        &[],
    );
    quote! {
        #stream_docs
        type #stream_ident: #core::__codegen::Stream<
            Item = ::core::result::Result<#output, #core::Status>,
        > + ::core::marker::Send + 'static;

        #docs
        fn #fn_ident(
            &self,
            request: #request,
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<#core::Response<Self::#stream_ident>, #core::Status>,
        > + ::core::marker::Send;
    }
}

/// The body of `Service::call`: route by method id, decode, run the handler, erase the type.
fn call_body(service: &ServiceModel) -> TokenStream {
    let ServiceModel {
        full_name, core, ..
    } = service;
    let unknown_message = format!("method id {{method_id:#010x}} is not part of {full_name}");
    let unknown = quote! {
        #core::server::HandlerFuture::new(async move {
            ::core::result::Result::Err(#core::Status::unimplemented(
                ::std::format!(#unknown_message),
            ))
        })
    };
    if service.methods.is_empty() {
        return quote! {
            ::core::mem::drop(call);
            #unknown
        };
    }
    let arms = service.methods.iter().map(|method| {
        let MethodModel {
            fn_ident,
            const_ident,
            kind,
            ..
        } = method;
        let run = match kind {
            MethodKind::Unary => quote!(unary),
            MethodKind::ServerStreaming => quote!(server_streaming),
            MethodKind::ClientStreaming => quote!(client_streaming),
            MethodKind::Bidi => quote!(streaming),
        };
        quote! {
            id if id == #const_ident.id => {
                let inner = ::std::sync::Arc::clone(&self.inner);
                #core::server::HandlerFuture::new(async move {
                    #core::server::#run(call, |request| inner.#fn_ident(request)).await
                })
            }
        }
    });
    quote! {
        match method_id {
            #(#arms)*
            _ => #unknown,
        }
    }
}
