import { provideHttpClient, withFetch, withInterceptors } from '@angular/common/http';
import { ApplicationConfig, provideBrowserGlobalErrorListeners } from '@angular/core';

import { idempotencyInterceptor } from './payments/idempotency.interceptor';

export const appConfig: ApplicationConfig = {
  providers: [
    provideBrowserGlobalErrorListeners(),
    // The interceptor owns retries for requests that carry an idempotency key.
    provideHttpClient(withFetch(), withInterceptors([idempotencyInterceptor])),
  ],
};
